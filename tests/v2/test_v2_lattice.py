"""`method: "dartree"` over vLLM's lattice drafters, DFlash2 and LiLiCorr, on vLLM's V2 runner
(vLLM's kernels in Triton's interpreter, float32), on drafters trained for the tiny trained
target (``models/tiny_lattice_pair.py``: one z-lab backbone, each lattice head trained on it).
The target's tree attention is vLLM's CPU backend here: these tests vary the drafter, whose
side is the same on every attention path (the CUDA-path lane, ``test_v2_cuda_path.py``,
runs every tree on vLLM's TRITON_ATTN).

- The dartree chain drafts what vLLM's own speculator for the checkpoint drafts (its greedy
  selector walk): the same draft tokens at every step, for every request; vLLM loads every
  weight of the checkpoint and its output equals target-only.
- Every variant over each lattice equals target-only decoding (greedy; seeded T > 0 on the
  pruned trees), and its drafts are accepted.
- TP=2: DFlash2's pruned tree, LiLiCorr's adaptive one; the pruned tree of each on the
  CUDA path (TRITON_ATTN).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import v1_target_only
from safetensors import safe_open

from vllm_dartree.harness.engine import drafter_of, generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import random_prompts
from vllm_dartree.models.tiny_lattice_pair import NUM_SPECULATIVE_TOKENS

BATCH = {"max_num_seqs": 8, "max_num_batched_tokens": 1024}
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
MAX_TOKENS = 32
DEPTHS = NUM_SPECULATIVE_TOKENS  # the drafters' block less the root: vLLM's own runs N = 8
FAMILIES = ["dflash2", "lilicorr"]
# Drafter parameters a checkpoint without embed_tokens / lm_head does not hold (vLLM shares
# the target's; mask_embedding is only for a mask_embedding.pt), and vLLM's stacked names.
SHARED = {"model.embed_tokens.weight", "lm_head.weight", "model.mask_embedding"}
STACKED = {".q_proj.": ".qkv_proj.", ".k_proj.": ".qkv_proj.", ".v_proj.": ".qkv_proj.",
           ".gate_proj.": ".gate_up_proj.", ".up_proj.": ".gate_up_proj."}


def greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def seeded(count: int):
    """T > 0 with a seed per request: V2 draws each token from (seed, position), so the
    output is exactly the seeded target-only output."""
    from vllm import SamplingParams

    return [SamplingParams(temperature=0.8, seed=200 + i, max_tokens=MAX_TOKENS,
                           ignore_eos=True) for i in range(count)]


def dartree(drafter, **settings):
    return {"method": "dartree", "model": str(drafter), **settings}


@pytest.fixture(scope="module")
def target(lattice_dflash2, lattice_lilicorr):
    assert lattice_dflash2[0] == lattice_lilicorr[0]  # one trained target: one reference
    return lattice_dflash2[0]


@pytest.fixture(scope="module", params=FAMILIES)
def lattice_pair(request):
    """(family, drafter dir) of a lattice drafter for ``target``."""
    return request.param, request.getfixturevalue(f"lattice_{request.param}")[1]


@pytest.fixture(scope="module")
def prompts(target):
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    return random_prompts(6, vocab, seed=17, min_len=3, max_len=24)


@pytest.fixture(scope="module")
def reference(engines, target, prompts):
    """Target-only output, greedy (equal to V1's) and seeded."""
    llm = engines.get(model=str(target), **BATCH)
    expected = generate_ids(llm, prompts, greedy())
    assert expected == v1_target_only(str(target), prompts, MAX_TOKENS, BATCH)
    return expected, generate_ids(llm, prompts, seeded(len(prompts)))


def engine_config(target, speculative: dict):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_dartree.plugin import register

    register()  # the gate, as vLLM's plugin loader installs it
    return EngineArgs(model=str(target), skip_tokenizer_init=True, dtype="float32",
                      speculative_config=speculative).create_engine_config()


@pytest.mark.parametrize("family, key", [("dflash2", "selector_top_k"),
                                         ("lilicorr", "lilicorr_candidate_topk")])
def test_a_lattice_drafter_corrects_with_its_own_k(request, family, key):
    """The lattice is the drafter's correction; K is the checkpoint's (refused otherwise,
    before any weight loads)."""
    from vllm_dartree.config import DARTreeConfigError, carried_layout

    target, drafter = request.getfixturevalue(f"lattice_{family}")
    top_k = json.loads((drafter / "config.json").read_text())["dflash_config"][key]
    config = engine_config(target, dartree(drafter, correction=True, top_k=top_k))
    layout = carried_layout(config.speculative_config)
    assert (layout.lattice, layout.lattice_top_k) == (family, top_k)
    with pytest.raises(DARTreeConfigError, match=rf"'top_k' = {top_k + 1} does not apply.*a "
                                                 rf"{family} drafter scores its own {top_k} "
                                                 "candidates"):
        engine_config(target, dartree(drafter, top_k=top_k + 1))


def loaded_names(drafter) -> set[str]:
    """The drafter model's parameter names the checkpoint's tensors load into (the
    backbone's under ``model.``, q/k/v and gate/up stacked; the LiLiCorr head's as named)."""
    with safe_open(str(drafter / "model.safetensors"), "pt") as f:
        names = {"model." + name for name in f.keys()}
    for old, new in STACKED.items():
        names = {n if n.startswith("model.lilicorr.") else n.replace(old, new) for n in names}
    return names


class DraftRecorder:
    """The draft tokens a speculator's ``propose`` returns, step by step (in-process)."""

    def __init__(self, llm, monkeypatch) -> None:
        self.steps: list[torch.Tensor] = []
        speculator = drafter_of(llm)
        propose = speculator.propose

        def recording(*args, **kwargs):
            drafts = propose(*args, **kwargs)
            if not kwargs.get("dummy_run", False):
                self.steps.append(drafts.clone())
            return drafts

        monkeypatch.setattr(speculator, "propose", recording)


@pytest.mark.e2e
def test_the_dartree_chain_drafts_vllms_selector_walk(engines, target, lattice_pair, prompts,
                                                       reference, monkeypatch):
    """vLLM's own speculator for the checkpoint (DFlash2Speculator / LiLiCorrSpeculator,
    method "dflash") against dartree's chain over the same lattice at the same depths: the
    same drafts at every step, the same accepted counts per position, the same output."""
    family, drafter = lattice_pair
    stock = engines.get(model=str(target), **BATCH, speculative_config={
        "method": "dflash", "model": str(drafter), "num_speculative_tokens": DEPTHS})
    assert type(drafter_of(stock)).__name__ == {"dflash2": "DFlash2Speculator",
                                                 "lilicorr": "LiLiCorrSpeculator"}[family]
    # vLLM's DFlash2 loader does not check coverage: every drafter weight is the checkpoint's
    params = {name for name, _ in drafter_of(stock).model.named_parameters(
        remove_duplicate=False)}
    assert params - SHARED == loaded_names(drafter)
    walk = DraftRecorder(stock, monkeypatch)
    assert generate_ids(stock, prompts, greedy()) == reference[0]
    walk_counts = spec_decode_counters(stock)

    ours = engines.get(model=str(target), **BATCH, speculative_config=dartree(
        drafter, tree="chain", num_speculative_tokens=DEPTHS))
    assert type(drafter_of(ours)).__name__ == {"dflash2": "DARTreeDFlash2Speculator",
                                               "lilicorr": "DARTreeLiLiCorrSpeculator"}[family]
    chain = DraftRecorder(ours, monkeypatch)
    assert generate_ids(ours, prompts, greedy()) == reference[0]
    assert len(chain.steps) == len(walk.steps) > 0
    for step, (mine, theirs) in enumerate(zip(chain.steps, walk.steps)):
        assert torch.equal(mine[:, :DEPTHS], theirs[:, :DEPTHS]), step
    counts = spec_decode_counters(ours)
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                "num_accepted_tokens_per_pos"):
        assert counts[key] == walk_counts[key], key
    assert counts["num_accepted_tokens"] / counts["num_drafts"] > 1.0, counts  # trained


VARIANTS = {
    "pruned": {"num_speculative_tokens": 16, "width": 4},
    "fixed": {"tree": "fixed", "num_speculative_tokens": 16},
    "ddtree": {"tree": "ddtree", "num_speculative_tokens": 16},
    "adaptive": {"num_speculative_tokens": 16, "budget_policy": "adaptive"},
}
RUNS = [(family, name) for family in FAMILIES for name in VARIANTS]


@pytest.mark.e2e
@pytest.mark.parametrize(("lattice_pair", "name"), RUNS, indirect=["lattice_pair"],
                         ids=[f"{family}-{name}" for family, name in RUNS])
def test_every_variant_over_a_lattice_matches_target_only(engines, target, lattice_pair,
                                                          prompts, reference, name):
    _, drafter = lattice_pair
    settings = VARIANTS[name]
    llm = engines.get(model=str(target), **BATCH, speculative_config=dartree(drafter,
                                                                              **settings))
    assert generate_ids(llm, prompts, greedy()) == reference[0]
    counters = spec_decode_counters(llm)
    tau = 1 + counters["num_accepted_tokens"] / counters["num_drafts"]
    print(f"{name}: tau = {tau:.2f} (greedy)")
    assert tau > 1.5, counters  # the trained lattice's drafts are accepted
    if name == "pruned":
        assert generate_ids(llm, prompts, seeded(len(prompts))) == reference[1]


@pytest.mark.e2e
def test_a_lattice_tree_at_tp2(engines, target, lattice_pair, prompts, reference,
                               one_core_per_rank):
    """Two ranks, one core each: vLLM's vocab-parallel candidates (its top-k gathers ids
    across ranks), each rank's lattice and trees the same."""
    family, drafter = lattice_pair
    settings = VARIANTS["pruned" if family == "dflash2" else "adaptive"]
    llm = engines.get(model=str(target), **BATCH, **TP2,
                      speculative_config=dartree(drafter, **settings))
    assert generate_ids(llm, prompts, greedy()) == reference[0]


@pytest.mark.e2e
def test_a_lattice_tree_on_the_cuda_path(engines, target, lattice_pair, prompts, reference):
    """The path GPU users run: vLLM's TRITON_ATTN with the plugin's Triton tree attention
    and KV mover (Triton's interpreter here), the pruned tree over each family's lattice."""
    _, drafter = lattice_pair
    llm = engines.get(model=str(target), **BATCH, attention_backend="TRITON_ATTN",
                      speculative_config=dartree(drafter, **VARIANTS["pruned"]))
    layers = llm.llm_engine.vllm_config.compilation_config.static_forward_context.values()
    assert "TreeTritonAttentionImpl" in {type(getattr(layer, "impl", None)).__name__
                                         for layer in layers}
    assert generate_ids(llm, prompts, greedy()) == reference[0]
