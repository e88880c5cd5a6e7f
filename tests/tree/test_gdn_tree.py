"""The Gated-DeltaNet tree reference (``tree/gdn.py``) against a per-path serial oracle:
every tree row's output equals running its own root-to-row path as a chain through
transformers' recurrence (``torch_recurrent_gated_delta_rule``, Qwen3-Next's) and torch's
depthwise ``conv1d``; the commit equals the state and conv window that chain leaves.

Tolerances: fp32 inputs, 1e-5 (both compute in fp32, summation order differs); bf16
inputs, one bf16 rounding of the output (rtol 2**-7, atol 1e-2): both upcast to fp32 and
round once at the end, so they can land one bf16 step apart.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

from vllm_dartree.tree.gdn import commit_path, conv_ancestors, tree_conv, tree_gated_delta_rule

HEADS, KEY_DIM, VALUE_DIM, CHANNELS, WIDTH = 4, 16, 8, 24, 4
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5},
             torch.bfloat16: {"rtol": 2 ** -7, "atol": 1e-2}}


def random_parents(gen: torch.Generator, requests: int, rows: int) -> torch.Tensor:
    """[R, T] parents_with_root layout: row 0 the root (its own parent), row r's parent a
    uniformly random earlier row."""
    parents = (torch.rand(requests, rows, generator=gen) * torch.arange(rows)).long()
    parents[:, 0] = 0
    return parents


def path_to(parents: torch.Tensor, request: int, row: int) -> list[int]:
    """Rows from the root to ``row``, root first (plain Python: the oracle's side)."""
    path = [row]
    while path[-1] != 0:
        path.append(int(parents[request, path[-1]]))
    return path[::-1]


def random_layer_inputs(gen: torch.Generator, requests: int, rows: int, dtype: torch.dtype):
    """What a GDN layer feeds the recurrence: l2-normalised keys and queries (queries also
    scaled by 1/sqrt(K)), decays in (0, 1), write strengths in (0, 1), a committed state."""
    def normal(*shape):
        return torch.randn(*shape, generator=gen)

    q = F.normalize(normal(requests, rows, HEADS, KEY_DIM), dim=-1) / KEY_DIM ** 0.5
    k = F.normalize(normal(requests, rows, HEADS, KEY_DIM), dim=-1)
    v = normal(requests, rows, HEADS, VALUE_DIM)
    g = -torch.rand(requests, rows, HEADS, generator=gen)
    beta = torch.rand(requests, rows, HEADS, generator=gen)
    state = normal(requests, HEADS, KEY_DIM, VALUE_DIM)
    return tuple(t.to(dtype) for t in (q, k, v, g, beta)), state


def chain_oracle(q, k, v, g, beta, state):
    """transformers' serial recurrence over one sequence [1, L, ...]; it scales queries by
    1/sqrt(K) itself, so the (already scaled) queries are scaled back first."""
    out, final = torch_recurrent_gated_delta_rule(
        q * KEY_DIM ** 0.5, k, v, g, beta, initial_state=state, output_final_state=True)
    return out, final


def conv_oracle(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu of the depthwise causal conv's last output over inputs [L, C] (L >= W)."""
    out = F.conv1d(inputs.t().unsqueeze(0).float(), weight.float().unsqueeze(1),
                   bias.float(), groups=inputs.shape[1])
    return F.silu(out[0, :, -1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", range(4))
def test_each_row_sees_only_its_own_path(seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    requests, rows = 3, 1 + 12
    parents = random_parents(gen, requests, rows)
    (q, k, v, g, beta), state = random_layer_inputs(gen, requests, rows, dtype)
    x = torch.randn(requests, rows, CHANNELS, generator=gen).to(dtype)
    conv_state = torch.randn(requests, CHANNELS, WIDTH - 1, generator=gen).to(dtype)
    weight = torch.randn(CHANNELS, WIDTH, generator=gen).to(dtype)
    bias = torch.randn(CHANNELS, generator=gen).to(dtype)

    out = tree_gated_delta_rule(q, k, v, g, beta, state, parents)
    conv = tree_conv(x, conv_state, weight, bias, parents)
    assert out.dtype == dtype and conv.dtype == dtype
    for r in range(requests):
        for row in range(rows):
            path = path_to(parents, r, row)
            expected, _ = chain_oracle(*(t[r:r + 1, path] for t in (q, k, v, g, beta)),
                                       state[r:r + 1])
            torch.testing.assert_close(out[r, row], expected[0, -1], **TOLERANCE[dtype])
            window = torch.cat([conv_state[r].t(), x[r, path]])
            torch.testing.assert_close(conv[r, row], conv_oracle(window, weight, bias).to(dtype),
                                       **TOLERANCE[dtype])


def test_a_chain_shaped_tree_is_the_chain():
    gen = torch.Generator().manual_seed(7)
    rows = 1 + 15
    parents = (torch.arange(rows) - 1).clamp(min=0).expand(2, rows)
    (q, k, v, g, beta), state = random_layer_inputs(gen, 2, rows, torch.float32)
    expected, _ = chain_oracle(q, k, v, g, beta, state)
    torch.testing.assert_close(tree_gated_delta_rule(q, k, v, g, beta, state, parents), expected,
                               **TOLERANCE[torch.float32])


def test_a_new_sibling_changes_no_other_row():
    """Siblings never see each other: a tree with one more leaf gives every old row the
    same output, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    requests, rows = 2, 1 + 10
    parents = random_parents(gen, requests, rows)
    (q, k, v, g, beta), state = random_layer_inputs(gen, requests, rows, torch.float32)
    before = tree_gated_delta_rule(*(t[:, :-1] for t in (q, k, v, g, beta)), state,
                                   parents[:, :-1])
    after = tree_gated_delta_rule(q, k, v, g, beta, state, parents)
    assert torch.equal(after[:, :-1], before)


def test_conv_ancestors_reach_into_the_committed_inputs():
    # Rows: root 0; 1 under root; 2 under 1; 3 under root. Width 4: committed at 0..2.
    parents = torch.tensor([[0, 0, 1, 0]])
    window = conv_ancestors(parents, 4)  # newest first, index 3 + row or 3 - k
    assert window[0].tolist() == [[3, 2, 1, 0], [4, 3, 2, 1], [5, 4, 3, 2], [6, 3, 2, 1]]


@pytest.mark.parametrize("seed", range(3))
def test_the_commit_is_what_the_accepted_chain_leaves(seed):
    """After acceptance, the committed conv window and state equal the chain of the accepted
    path's rows; the next step verified from them equals one chain over both steps."""
    gen = torch.Generator().manual_seed(seed)
    requests, rows = 3, 1 + 12
    parents = random_parents(gen, requests, rows)
    (q, k, v, g, beta), state = random_layer_inputs(gen, requests, rows, torch.float32)
    x = torch.randn(requests, rows, CHANNELS, generator=gen)
    conv_state = torch.randn(requests, CHANNELS, WIDTH - 1, generator=gen)
    # Accept the path to a random row per request (request 1: the root alone).
    ends = torch.randint(0, rows, (requests,), generator=gen)
    ends[1] = 0
    paths = [path_to(parents, r, int(ends[r])) for r in range(requests)]
    accepted = torch.full((requests, rows), -1)
    for r, path in enumerate(paths):
        accepted[r, :len(path)] = torch.tensor(path)

    new_conv, new_state = commit_path(x, k, v, g, beta, conv_state, state, accepted)
    for r, path in enumerate(paths):
        _, expected_state = chain_oracle(*(t[r:r + 1, path] for t in (q, k, v, g, beta)),
                                         state[r:r + 1])
        torch.testing.assert_close(new_state[r], expected_state[0], **TOLERANCE[torch.float32])
        history = torch.cat([conv_state[r].t(), x[r, path]])
        assert torch.equal(new_conv[r], history[-(WIDTH - 1):].t())

    # The next step: a chain of 3 rows from the committed state equals one chain over the
    # accepted path and those rows from the old state.
    (q2, k2, v2, g2, beta2), _ = random_layer_inputs(gen, requests, 3, torch.float32)
    chain = torch.tensor([[0, 0, 1]]).expand(requests, 3)
    out = tree_gated_delta_rule(q2, k2, v2, g2, beta2, new_state, chain)
    for r, path in enumerate(paths):
        both = [torch.cat([t[r:r + 1, path], t2[r:r + 1]], dim=1)
                for t, t2 in zip((q, k, v, g, beta), (q2, k2, v2, g2, beta2))]
        expected, _ = chain_oracle(*both, state[r:r + 1])
        torch.testing.assert_close(out[r], expected[0, -3:], **TOLERANCE[torch.float32])


def test_verification_writes_nothing():
    gen = torch.Generator().manual_seed(11)
    parents = random_parents(gen, 2, 9)
    (q, k, v, g, beta), state = random_layer_inputs(gen, 2, 9, torch.float32)
    x = torch.randn(2, 9, CHANNELS, generator=gen)
    conv_state = torch.randn(2, CHANNELS, WIDTH - 1, generator=gen)
    kept = state.clone(), conv_state.clone()
    tree_gated_delta_rule(q, k, v, g, beta, state, parents)
    tree_conv(x, conv_state, torch.randn(CHANNELS, WIDTH, generator=gen), None, parents)
    commit_path(x, k, v, g, beta, conv_state, state, torch.tensor([[0, -1], [0, 1]]))
    assert torch.equal(state, kept[0]) and torch.equal(conv_state, kept[1])


# ---- flat rows in an engine's state slots (tree_conv_rows, tree_delta_rule_in_slots) ------
def flat_case(gen: torch.Generator, rows_per_request: list[int], dtype: torch.dtype,
              num_slots: int = 40):
    """A flat batch as an engine lays it out: requests' rows one after another, each request
    with its own state slots (one per row, shuffled over ``num_slots``) and its committed
    conv window at a random offset of its first slot's buffer; random parents (earlier
    rows). Returns the twins' arguments and, per request, its padded parents."""
    max_rows = max(rows_per_request)
    length = WIDTH - 1 + max_rows
    slots = torch.randperm(num_slots, generator=gen)[: len(rows_per_request) * max_rows]
    slots = slots.view(len(rows_per_request), max_rows)
    accepted = torch.tensor([int(torch.randint(1, max_rows + 1, (1,), generator=gen))
                             for _ in rows_per_request])
    parents = random_parents(gen, len(rows_per_request), max_rows)
    starts = torch.tensor([0, *torch.tensor(rows_per_request).cumsum(0).tolist()])
    row_request = torch.repeat_interleave(torch.arange(len(rows_per_request)),
                                          torch.tensor(rows_per_request))
    local = torch.arange(int(starts[-1])) - starts[row_request]
    parent_local = parents[row_request, local]
    # Conv sources, newest first: rows of the flat batch or committed columns (-1 - j).
    window = conv_ancestors(parents, WIDTH)  # [S, T, W] into [committed, rows]
    window = window[row_request, local]
    sources = torch.where(window >= WIDTH - 1, starts[row_request, None] + window - (WIDTH - 1),
                          -1 - window)
    row_slot = slots[row_request, local]
    parent_slot = torch.where(local == 0, slots[row_request, accepted[row_request] - 1],
                              slots[row_request, parent_local])
    x = torch.randn(int(starts[-1]), CHANNELS, generator=gen).to(dtype)
    conv_state = torch.randn(num_slots, CHANNELS, length, generator=gen).to(dtype)
    (q, k, v, g, beta), _ = random_layer_inputs(gen, 1, int(starts[-1]), dtype)
    state = torch.randn(num_slots, HEADS, VALUE_DIM, KEY_DIM, generator=gen)
    return dict(x=x, conv_state=conv_state, window_slot=slots[:, 0], window_start=accepted - 1,
                row_request=row_request, sources=sources, weight=torch.randn(
                    CHANNELS, WIDTH, generator=gen), bias=torch.randn(CHANNELS, generator=gen),
                q=q[0], k=k[0], v=v[0], g=g[0], beta=beta[0], state=state, row_slot=row_slot,
                parent_slot=parent_slot, request_starts=starts, slots=slots,
                accepted=accepted, parents=parents, local=local)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_flat_rows_in_slots_equal_the_padded_reference(dtype):
    """The engine-layout twins give each row what the padded reference gives it (conv
    along its path from the committed window; recurrence from the state in the slot the
    request's accepted count names), and leave each row's state in its own slot."""
    from vllm_dartree.tree.gdn import tree_conv_rows, tree_delta_rule_in_slots

    gen = torch.Generator().manual_seed(31)
    case = flat_case(gen, [1, 5, 3, 7], dtype)
    conv_before, state_before = case["conv_state"].clone(), case["state"].clone()
    conv = tree_conv_rows(case["x"], case["conv_state"], case["window_slot"],
                          case["window_start"], case["row_request"], case["sources"],
                          case["weight"], case["bias"])
    state = case["state"]
    out = tree_delta_rule_in_slots(case["q"], case["k"], case["v"], case["g"], case["beta"],
                                   state, case["row_slot"], case["parent_slot"])
    assert torch.equal(case["conv_state"], conv_before)  # the conv reads only
    for s, (start, end) in enumerate(zip(case["request_starts"][:-1].tolist(),
                                         case["request_starts"][1:].tolist())):
        rows = end - start
        parents = case["parents"][s:s + 1, :rows]
        offset = int(case["window_start"][s])
        window = conv_before[case["window_slot"][s], :, offset:offset + WIDTH - 1]
        want_conv = tree_conv(case["x"][None, start:end], window[None], case["weight"],
                              case["bias"], parents)[0]
        torch.testing.assert_close(conv[start:end], want_conv, **TOLERANCE[dtype])
        initial = state_before[case["slots"][s, case["accepted"][s] - 1]].transpose(-1, -2)
        want, states = tree_gated_delta_rule(
            *(t[None, start:end] for t in (case["q"], case["k"], case["v"], case["g"],
                                           case["beta"])), initial[None], parents,
            return_states=True)
        torch.testing.assert_close(out[start:end], want[0], **TOLERANCE[dtype])
        got_states = state[case["slots"][s, :rows]].transpose(-1, -2)
        # Children read their parent's rounded state: fp32 states match to 1e-5.
        torch.testing.assert_close(got_states, states[0], rtol=1e-5, atol=1e-5)
