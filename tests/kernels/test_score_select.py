"""score_select kernel (Triton, interpreted on CPU) against its torch twin, and the twin
against the supertree builder it factors out (``grow_supertree``).

The kernel runs in a fresh subprocess with TRITON_INTERPRET=1 (see test_topb.py).
"""

import textwrap
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from csrc_triton.score_select import score_select, score_select_torch
from vllm_dartree.tree import DominoHead
from vllm_dartree.tree.build import (
    Supertree,
    capacity_limited,
    fixed_quotas,
    grow_supertree,
    needs_states,
    prepare_candidates,
)

ARGS = ("parent_scores", "base", "quota", "z_proj", "s_proj", "cand_weights")


def random_case(gen, num_requests, parents, top_k, proj, quota, *, bias=True,
                dtype=torch.float32) -> dict:
    case = dict(parent_scores=-3 * torch.rand(num_requests, parents, generator=gen),
                base=3 * torch.randn(num_requests, top_k, generator=gen), quota=quota,
                z_proj=None, s_proj=None, cand_weights=None)
    if bias:
        case.update(
            z_proj=torch.randn(num_requests, proj, generator=gen).to(dtype),
            s_proj=torch.randn(num_requests, parents, proj, generator=gen).to(dtype),
            cand_weights=(torch.randn(num_requests, top_k, proj, generator=gen)
                          / proj**0.5).to(dtype))
    return case


def tie_case() -> dict:
    """Zero weights, integer base logits, repeated parent scores: many exactly equal pair
    scores, so the order is decided by the flat index alone."""
    gen = torch.Generator().manual_seed(5)
    return dict(parent_scores=torch.tensor([[-1.0, -2.0, -1.0, -2.0], [0.0, 0.0, 0.0, 0.0]]),
                base=torch.randint(-2, 2, (2, 16), generator=gen).float(), quota=40,
                z_proj=torch.randn(2, 16, generator=gen), s_proj=torch.randn(2, 4, 16),
                cand_weights=torch.zeros(2, 16, 16))


def strided_case(gen) -> dict:
    """cand_weights as the depth slice of a [R, D, K, E] gather (not contiguous over R)."""
    case = random_case(gen, 2, 6, 24, 40, 30)
    case["cand_weights"] = torch.randn(2, 3, 24, 40, generator=gen)[:, 1] / 40**0.5
    return case


def grow_with(select, candidates, head, root_tokens, quotas) -> tuple[Supertree, list[dict]]:
    """``grow_supertree`` written around a score_select function; also returns each depth's
    inputs (realistic kernel cases)."""
    num_requests, num_depths, _ = candidates.ids.shape
    with_states = needs_states(head, num_depths)
    states = head.root_state(root_tokens).unsqueeze(1) if with_states else None
    frontier = torch.zeros(num_requests, 1)
    frontier_nodes = torch.zeros(num_requests, 1, dtype=torch.int64)
    parts, inputs, next_node = [], [], 1
    for depth, quota in enumerate(quotas, start=1):
        case = dict(parent_scores=frontier, base=candidates.base[:, depth - 1], quota=quota,
                    z_proj=None, s_proj=None, cand_weights=None)
        if head.corrects_depth(depth):
            case.update(z_proj=candidates.z_proj[:, depth - 1], s_proj=states @ head.proj_s.T,
                        cand_weights=candidates.weights[:, depth - 1])
        inputs.append(case)
        parent_slot, cand_slot, scores = select(*(case[name] for name in ARGS))
        tokens = candidates.ids[:, depth - 1].gather(1, cand_slot)
        parts.append((tokens, frontier_nodes.gather(1, parent_slot),
                      torch.full_like(tokens, depth), scores))
        if with_states and depth < num_depths:
            index = parent_slot.unsqueeze(-1).expand(-1, -1, states.shape[-1])
            states = head.advance(states.gather(1, index), tokens)
        frontier = scores
        frontier_nodes = torch.arange(next_node, next_node + quota).expand(num_requests, quota)
        next_node += quota
    return Supertree(*(torch.cat(p, dim=1) for p in zip(*parts))), inputs


def head_setup(seed: int, num_depths: int = 5, top_k: int = 16):
    gen = torch.Generator().manual_seed(seed)
    head = DominoHead.random(vocab=300, hidden=32, state=16, proj=24, generator=gen)
    base_logits = 2 * torch.randn(3, num_depths, 300, generator=gen)
    hidden = torch.randn(3, num_depths, 32, generator=gen)
    candidates = prepare_candidates(base_logits, hidden, head, top_k)
    return head, candidates, torch.tensor([1, 7, 42])


def make_cases() -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    cases = [
        random_case(gen, 2, 12, 64, 256, 12),  # DARTree shapes: W 12, K 64, E 256
        random_case(gen, 3, 1, 64, 64, 12),  # depth 1: the root is the only parent
        random_case(gen, 2, 5, 10, 20, 50),  # nothing a power of two
        random_case(gen, 2, 3, 8, 16, 24),  # quota = W * K (every pair, fully sorted)
        random_case(gen, 2, 4, 8, 16, 7, bias=False),  # uncorrected depth
        random_case(gen, 2, 7, 32, 48, 9, dtype=torch.bfloat16),  # bf16 head, fp32 math
        random_case(gen, 1, 2, 16, 16, 0),  # quota 0
        tie_case(),
        strided_case(gen),
    ]
    head, candidates, root = head_setup(1)
    _, depth_cases = grow_with(score_select_torch, candidates, head, root,
                               capacity_limited([6] * 5, 16))
    return cases + depth_cases[:3]


def run_interpreted_kernel(cases: list[dict], tmp_path: Path) -> list[tuple]:
    inputs, outputs = tmp_path / "cases.pt", tmp_path / "out.pt"
    torch.save(cases, inputs)
    script = textwrap.dedent(f"""
        import torch
        import csrc_triton.score_select as ss

        def forbidden(*args, **kwargs):
            raise AssertionError("score_select fell back to the torch twin")

        assert ss.interpreter_loaded()
        names = {ARGS!r}
        cases = torch.load({str(inputs)!r})
        results = [ss.score_select_triton(*[case[n] for n in names]) for case in cases]
        ss.score_select_torch = forbidden  # the dispatcher must pick the kernel
        dispatched = ss.score_select(*[cases[0][n] for n in names])
        torch.save((results, dispatched), {str(outputs)!r})
    """)
    results, dispatched = run_interpreted(script, outputs)
    assert all(torch.equal(a, b) for a, b in zip(results[0], dispatched))
    return results


def fp32_inputs(case: dict) -> tuple:
    """The kernel computes in fp32 whatever the input dtype: compare with the twin on the
    same values upcast."""
    return tuple(v.float() if isinstance(v, torch.Tensor) else v
                 for v in (case[name] for name in ARGS))


def test_interpreted_kernel_equals_twin(tmp_path):
    cases = make_cases()
    for index, (case, (parent, cand, score)) in enumerate(
            zip(cases, run_interpreted_kernel(cases, tmp_path))):
        twin_parent, twin_cand, twin_score = score_select_torch(*fp32_inputs(case))
        assert parent.dtype == cand.dtype == torch.int64 and score.dtype == torch.float32
        assert parent.shape == (case["base"].shape[0], case["quota"]), index
        assert torch.equal(parent, twin_parent), index
        assert torch.equal(cand, twin_cand), index
        torch.testing.assert_close(score, twin_score, atol=1e-4, rtol=0)


def test_twin_grows_the_same_supertree_as_the_builder():
    for seed, quota_kind in ((1, "pruned"), (2, "fixed")):
        head, candidates, root = head_setup(seed)
        quotas = (capacity_limited([6] * 5, 16) if quota_kind == "pruned"
                  else fixed_quotas(20, 5, 16))
        ours, _ = grow_with(score_select_torch, candidates, head, root, quotas)
        reference = grow_supertree(candidates, head, root, quotas)
        for name in ("tokens", "parents", "depths", "scores"):
            assert torch.equal(getattr(ours, name), getattr(reference, name)), name


def test_ties_go_to_the_lower_flat_index():
    case = tie_case()
    parent, cand, score = score_select_torch(*fp32_inputs(case))
    flat = parent * case["base"].shape[1] + cand
    for row_scores, row_flat in zip(score.tolist(), flat.tolist()):
        keys = [(-s, f) for s, f in zip(row_scores, row_flat)]
        assert keys == sorted(keys)  # score descending, then flat index ascending


def test_dispatcher_uses_twin_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = make_cases()[2]
    for a, b in zip(score_select(*fp32_inputs(case)), score_select_torch(*fp32_inputs(case))):
        assert torch.equal(a, b)


def test_argument_checks():
    gen = torch.Generator().manual_seed(0)
    case = random_case(gen, 2, 3, 8, 16, 4)
    with pytest.raises(ValueError, match="quota must be in 0..W\\*K=24"):
        score_select_torch(*fp32_inputs({**case, "quota": 25}))
    with pytest.raises(ValueError, match="all or none"):
        score_select_torch(*fp32_inputs({**case, "s_proj": None}))
    with pytest.raises(ValueError, match="cand_weights must be"):
        score_select_torch(*fp32_inputs({**case, "cand_weights": case["cand_weights"][:, :4]}))
