"""The committed SmolLM2 drafter (benchmarks/drafters/smollm2-135m-domino) inside vLLM: every
variant gives exactly the target-only greedy tokens, and the trained drafter really drafts
(pruned accepts several tokens per round, more than the DFlash chain).

Prompts are everyday questions, not benchmark or training prompts.
"""

from __future__ import annotations

import json

import pytest
import torch

from vllm_dartree.env import project_root
from vllm_dartree.models import smollm2

pytestmark = pytest.mark.e2e

DRAFTER = project_root() / smollm2.DRAFTER
QUESTIONS = [
    "Tom has 3 apples and buys 4 more. How many apples does he have? Think step by step.",
    "Write a Python function that checks whether a number is prime.",
    "A train travels 60 km per hour for 2 hours. How far does it go?",
    "Explain what a list comprehension is in Python, with an example.",
]
NEW_TOKENS = 32
ENGINE = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 4}


@pytest.fixture(scope="module")
def prompts(model_dir):
    from vllm_dartree.training.data import encode_prompts

    return encode_prompts(model_dir, QUESTIONS)


@pytest.fixture(scope="module")
def target_only(engines, model_dir, prompts):
    from vllm import SamplingParams

    from vllm_dartree.harness.engine import generate_ids

    llm = engines.get(model=str(model_dir), **ENGINE)
    return generate_ids(llm, prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))


def test_committed_drafter_is_small_and_in_domino_format():
    config = json.loads((DRAFTER / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"]["projector_type"] == "domino"
    assert config["dflash_config"]["shift_label"] is True and config["block_size"] == 16
    assert (DRAFTER / "model.safetensors").stat().st_size < 40 << 20
    assert (DRAFTER / "README.md").exists()


@pytest.fixture(scope="module")
def taus(engines, model_dir, prompts, target_only):
    from vllm import SamplingParams

    from vllm_dartree.bench.methods import TreeParams, speculative_config
    from vllm_dartree.bench.run import counter_delta
    from vllm_dartree.harness.engine import generate_ids, spec_decode_counters

    found = {}
    for method in ("dartree-pruned", "dflash"):
        llm = engines.get(model=str(model_dir), **ENGINE,
                          speculative_config=speculative_config(method, DRAFTER, TreeParams()))
        before = spec_decode_counters(llm)
        out = generate_ids(llm, prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
        assert out == target_only, f"{method} changed the target's greedy output"
        found[method] = counter_delta(before, spec_decode_counters(llm))["tau_vllm"]
    return found


def test_trained_drafter_accepts_and_tree_beats_chain(taus):
    assert taus["dartree-pruned"] > 2.0, taus
    assert taus["dartree-pruned"] > taus["dflash"], taus


def test_the_16k_token_head_is_lossless_and_accepts_as_much(engines, model_dir, prompts,
                                                            target_only, taus):
    """The bench's default drafter: the committed one with its lm_head cut to 16k tokens
    (models/draft_vocab.py). Same greedy output; on these prompts its trees are accepted
    about as deeply as the full head's."""
    from vllm import SamplingParams

    from vllm_dartree.bench.methods import TreeParams, speculative_config
    from vllm_dartree.bench.run import counter_delta
    from vllm_dartree.harness.engine import drafter_of, generate_ids, spec_decode_counters
    from vllm_dartree.models.draft_vocab import ensure_reduced_smollm2_drafter

    drafter = ensure_reduced_smollm2_drafter()
    llm = engines.get(model=str(model_dir), **ENGINE, speculative_config=speculative_config(
        "dartree-pruned", drafter, TreeParams()))
    before = spec_decode_counters(llm)
    out = generate_ids(llm, prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
    assert out == target_only
    tau = counter_delta(before, spec_decode_counters(llm))["tau_vllm"]
    assert tau > taus["dartree-pruned"] - 0.15, (tau, taus)
    # The tree core reads the head's 16k columns and their token ids: scattered back, they
    # are vLLM's full-vocabulary logits (every other column -inf).
    model = drafter_of(llm).model
    hidden = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    columns, ids = model.draft_logits(hidden, min_columns=16)
    assert columns.shape == (5, 16384) and bool((ids[1:] > ids[:-1]).all())
    full = torch.full((5, model.config.vocab_size), float("-inf"))
    full[:, ids] = columns
    assert torch.equal(full, model.compute_logits(hidden))
    wide, no_ids = model.draft_logits(hidden, min_columns=20000)  # more than the head has
    assert no_ids is None and torch.equal(wide, full)
