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
