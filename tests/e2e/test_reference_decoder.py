"""The plain-lines reference decoder (``vllm_dartree/reference.py``) as the plugin's oracle.

On the tiny trained pair at T=0, for every variant, the plugin inside vLLM and the reference
must propose the same tree in every round (real nodes: tokens, parents, depths), accept the
same path and commit the same tokens, and both outputs must be the target's own greedy
output. Rounds are collected from vLLM with ``TreeVerifier.observing``; prompts run one at a
time (``max_num_seqs=1``) so every observed step is a round of that prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from vllm_dartree.models.tiny import random_prompts
from vllm_dartree.reference import Decoded, reference_decode
from vllm_dartree.training.train import torch_threads

NEW_TOKENS = 40
SCORE_TOL = 1e-4  # |plugin - reference| path score of a node (log-prob units, float32)
# Small settings that still give real trees on a 32-token vocabulary; chains verify one
# node per drafter depth (the block, 16), as bench/methods.py configures them.
VARIANTS = {
    "pruned": {"tree": "pruned", "num_speculative_tokens": 24, "width": 4, "top_k": 8,
               "correction": True},
    "fixed": {"tree": "fixed", "num_speculative_tokens": 24, "top_k": 8, "correction": True},
    "ddtree": {"tree": "ddtree", "num_speculative_tokens": 24},
    "domino": {"tree": "chain", "num_speculative_tokens": 16, "top_k": 8, "correction": True},
    "dflash": {"tree": "chain", "num_speculative_tokens": 16, "correction": False},
}


@pytest.fixture(scope="module")
def prompts(pair):
    vocab = json.loads((pair[0] / "config.json").read_text())["vocab_size"]
    return random_prompts(4, vocab, seed=11)


@pytest.fixture(scope="module")
def models(pair):
    """The HF target (float32) and the training drafter sharing its embedding and lm_head."""
    from vllm_dartree.training.data import load_target
    from vllm_dartree.training.train import load_drafter, target_tables

    target = load_target(pair[0])
    return target, load_drafter(pair[1], *target_tables(target)).eval()


@torch.no_grad()
def greedy_decode(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The target alone, argmax after argmax, the whole sequence recomputed every token."""
    tokens = list(prompt)
    with torch_threads(1):  # tiny matmuls: 2 threads on a shared 2-core box are ~100x slower
        for _ in range(max_new_tokens):
            logits = target(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, -1]
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


def reference(models, prompt: list[int], settings: dict) -> Decoded:
    """The reference decoder under the plugin's speculative settings."""
    target, drafter = models
    knobs = {k: v for k, v in settings.items() if k in ("tree", "width", "top_k", "correction")}
    with torch_threads(1):
        return reference_decode(target, drafter, prompt, NEW_TOKENS,
                                budget=settings["num_speculative_tokens"], **knobs)


# ----------------------------------------------------------------------------- unit
def test_reference_decoder_is_lossless(models, prompts):
    """Greedy by construction: the reference's output is the target's greedy output, and
    its trees are real (more than one token committed in some round)."""
    decoded = reference(models, prompts[0], VARIANTS["pruned"])
    assert decoded.output == greedy_decode(models[0], prompts[0], NEW_TOKENS)
    assert max(len(r.accepted) for r in decoded.rounds) > 2
    assert all(len(r.tokens) == 24 for r in decoded.rounds)


# ------------------------------------------------------------------------------ e2e
@dataclass
class PluginRound:
    """One verified tree step of the plugin (one request: max_num_seqs=1)."""

    tokens: list[int]  # real (valid) nodes only, column order
    parents: list[int]
    depths: list[int]
    scores: list[float]
    accepted_nodes: list[int]


def plugin_rounds(llm, prompt: list[int]) -> tuple[list[int], list[PluginRound]]:
    """Generate ``prompt`` greedily in vLLM and record every round the verifier accepts."""
    from vllm_dartree.harness.engine import generate_ids
    from vllm_dartree.step.verifier import TreeVerifier

    rounds: list[PluginRound] = []

    def record(accepted) -> None:
        tree = accepted.plan.tree
        assert len(accepted.plan.req_ids) == 1, "one request per step (max_num_seqs=1)"
        real = tree.valid[0].cpu()
        length = int(accepted.num_accepted[0])
        rounds.append(PluginRound(
            tokens=tree.tokens[0].cpu()[real].tolist(),
            parents=tree.parents[0].cpu()[real].tolist(),
            depths=tree.depths[0].cpu()[real].tolist(),
            scores=tree.scores[0].cpu()[real].tolist(),
            accepted_nodes=accepted.accepted_nodes[0, :length].cpu().tolist(),
        ))

    with TreeVerifier.observing(record):
        output = generate_ids(llm, [prompt], greedy_params())[0]
    return output, rounds


def first_difference(plugin: PluginRound, ref) -> str:
    """Where two trees part, with the plugin's path scores there (near-tie diagnosis)."""
    mine = list(zip(plugin.tokens, plugin.parents, plugin.depths))
    theirs = list(zip(ref.tokens, ref.parents, ref.depths))
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
              min(len(mine), len(theirs)))
    near = slice(max(0, at - 2), at + 3)
    return (f"trees differ at column {at}: plugin {mine[at:at + 3]} vs reference "
            f"{theirs[at:at + 3]}; path scores near there: plugin {plugin.scores[near]}, "
            f"reference {ref.scores[near]} ({len(mine)} vs {len(theirs)} nodes)")


def greedy_params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def target_only(engines, pair, prompts, models):
    """vLLM's target alone; checked once against the HF target's own greedy decoding."""
    from vllm_dartree.harness.engine import generate_ids

    outputs = generate_ids(engines.get(model=str(pair[0]), max_num_seqs=1), prompts,
                           greedy_params())
    assert outputs == [greedy_decode(models[0], p, NEW_TOKENS) for p in prompts]
    return outputs


@pytest.mark.e2e
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_plugin_rounds_equal_the_reference(engines, pair, prompts, models, target_only,
                                           variant):
    settings = VARIANTS[variant]
    llm = engines.get(model=str(pair[0]), max_num_seqs=1, speculative_config={
        "method": "dartree", "model": str(pair[1]), **settings})
    nodes_checked, score_diff = 0, 0.0
    for index, prompt in enumerate(prompts):
        output, observed = plugin_rounds(llm, prompt)
        ref = reference(models, prompt, settings)
        where = f"{variant}, prompt {index}"
        assert output == ref.output == target_only[index], where
        assert len(observed) == len(ref.rounds), f"{where}: round counts"
        offset = 1  # the prefill emitted the first token
        for number, (mine, theirs) in enumerate(zip(observed, ref.rounds)):
            at = f"{where}, round {number}"
            same_tree = (mine.tokens, mine.parents, mine.depths) == (
                theirs.tokens, theirs.parents, theirs.depths)
            assert same_tree, f"{at}: {first_difference(mine, theirs)}"
            assert mine.accepted_nodes == theirs.accepted_nodes, at
            # Same tree, same scores up to float noise (vLLM's drafter vs the pure-torch one).
            gap = max(abs(a - b) for a, b in zip(mine.scores, theirs.scores))
            assert gap <= SCORE_TOL, f"{at}: path scores differ by {gap:.3g}"
            score_diff = max(score_diff, gap)
            # vLLM's committed tokens of the round (the last round may be cut at max_tokens)
            committed = output[offset: offset + len(mine.accepted_nodes)]
            assert committed == theirs.accepted[:len(committed)], at
            offset += len(mine.accepted_nodes)
            nodes_checked += len(mine.tokens)
        assert offset >= NEW_TOKENS, where
    print(f"{variant}: {nodes_checked} tree nodes equal across {len(prompts)} prompts, "
          f"path scores within {score_diff:.2e}")
