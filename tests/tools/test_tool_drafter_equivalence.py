"""The drafter a dartree engine builds from a SpecForge or Model-Optimizer checkpoint computes
what the tool's own model computes: the engine's first draft after a prompt's prefill (a
chain over every depth, top_k = V: the full-vocabulary argmax) is captured, and the tool's
own forward and heads (``tool_forward.py``, in a subprocess) run on the same context
features and block. The block slots each depth reads (shift or not), the backbone's outputs
there, the chain's tokens under the tool's own head (Domino's GRU, DSpark's Markov bias) and
DSpark's confidence must agree: this is what "read as the tool wrote it" means beyond the
config's fields."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_tool_checkpoints import LOADS
from tool_writers import ROW, TARGET, write

from vllm_dartree.harness.engine import generate_ids
from vllm_dartree.models.tiny import random_prompts, write_target

pytestmark = pytest.mark.e2e

PROMPT = random_prompts(1, TARGET.vocab_size, seed=31, min_len=23, max_len=23)[0]
REL_TOL = 1e-4
SCRIPT = Path(__file__).with_name("tool_forward.py")
ROWS = ["specforge-dflash", "specforge-domino", "specforge-dspark", "modelopt-dflash",
        "modelopt-domino", "modelopt-dspark", "speculators-dflash-full_attention=True",
        "speculators-dflash-full_attention=True-sample_from_anchor=True",
        "speculators-dspark-full_attention=True"]


def capture_first_draft(llm) -> dict:
    """The engine's first drafter call for PROMPT: its context features, root, per-depth
    hidden states and the chain it proposed."""
    from vllm import SamplingParams

    from vllm_dartree.integration.v1.proposer import DARTreeProposer

    seen: dict = {}
    draft_block, propose = DARTreeProposer._draft_block, DARTreeProposer.propose

    def capturing_draft_block(self, target_token_ids, target_positions, target_hidden_states,
                              next_token_ids, *rest):
        out = draft_block(self, target_token_ids, target_positions, target_hidden_states,
                          next_token_ids, *rest)
        if "depth_hidden" not in seen:
            seen.update(model=self.model, tokens=target_token_ids.clone(),
                        context=target_hidden_states.clone(),
                        root=int(next_token_ids[0]), depth_hidden=self.depth_hidden_of(out)[0],
                        mask=self.layout.mask_token_id, block_size=self.layout.block_size)
        return out

    def capturing_propose(self, *args, **kwargs):
        tokens = propose(self, *args, **kwargs)
        seen.setdefault("chain", torch.as_tensor(tokens[0]).clone())
        return tokens

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DARTreeProposer, "_draft_block", capturing_draft_block)
        patch.setattr(DARTreeProposer, "propose", capturing_propose)
        generate_ids(llm, [PROMPT], SamplingParams(temperature=0.0, max_tokens=4,
                                                   ignore_eos=True))
    assert "chain" in seen, "the engine never called the drafter"
    return seen


def close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    scale = max(1.0, expected.abs().max().item())
    return (actual.float() - expected.float()).abs().max().item() <= REL_TOL * scale


@pytest.fixture(scope="module")
def both_sides(engines, tiny_target, tmp_path_factory) -> dict:
    """Per row: the engine's first draft (captured) and the tool's outputs on its inputs.
    One subprocess per tool computes the tool's side of all its rows."""
    folder = tmp_path_factory.mktemp("equivalence")
    ours, jobs = {}, {}
    for name in ROWS:
        drafter = write(ROW[name])
        llm = engines.get(model=str(tiny_target), max_num_seqs=1, speculative_config={
            "method": "dartree", "model": str(drafter), "tree": "chain",
            "top_k": TARGET.vocab_size, "num_speculative_tokens": 16,
            "correction": LOADS[name][0] is not None})
        seen = capture_first_draft(llm)
        depths = seen["depth_hidden"].shape[0]
        seen["chain"] = seen["chain"][:depths].long().cpu()
        seen["block"] = torch.tensor([seen["root"]] + [seen["mask"]] * (seen["block_size"] - 1))
        # DSpark's confidence, while the engine (and its drafter) is alive
        previous = torch.cat([torch.tensor([seen["root"]]), seen["chain"][:-1]])
        with torch.no_grad():
            confidence = seen.pop("model").chain_confidence(
                seen["depth_hidden"][None], previous[None].to(seen["depth_hidden"].device))
        seen["confidence"] = None if confidence is None else confidence[0].cpu()
        seen["depth_hidden"] = seen["depth_hidden"].cpu()
        ours[name] = seen
        inputs = folder / f"{name}-inputs.safetensors"
        save_file({"context": seen["context"].float().cpu().contiguous(),
                   "block": seen["block"], "chain": seen["chain"]}, str(inputs))
        jobs.setdefault(ROW[name].tool, []).append(
            (asdict(ROW[name]), str(drafter), str(write_target(TARGET)), str(inputs),
             str(folder / f"{name}-out.safetensors")))
    for tool_jobs in jobs.values():
        done = subprocess.run([sys.executable, str(SCRIPT), json.dumps(tool_jobs)],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    return {name: (ours[name], load_file(str(folder / f"{name}-out.safetensors")))
            for name in ROWS}


@pytest.mark.parametrize("name", ROWS)
def test_the_engines_drafter_computes_what_the_tool_computes(both_sides, name):
    seen, theirs = both_sides[name]
    assert seen["tokens"].tolist() == PROMPT
    head, block, shift = LOADS[name][0], LOADS[name][2], LOADS[name][3]
    chain, depths = seen["chain"], seen["depth_hidden"].shape[0]
    # The slots each depth reads: 0..B-1 (shift, B depths) or 1..B-1 (z-lab's, B - 1).
    assert depths == (block if shift else block - 1)
    slots = theirs["hidden"][0 if shift else 1:][:depths]
    assert close(seen["depth_hidden"], slots)
    lm_head = load_file(str(write_target(TARGET) / "model.safetensors"))["lm_head.weight"]
    logits = base = slots @ lm_head.T
    if head is not None:
        logits = theirs["corrected"]
        # the head decides some depths (else this would not test reading it)
        assert (logits.argmax(-1) != base.argmax(-1)).any()
    # Every drafted token is the tool's argmax given the chain before it (ties to 1e-4).
    best = logits.max(dim=-1).values
    picked = logits.gather(1, chain[:, None])[:, 0]
    assert ((best - picked) <= REL_TOL * best.abs().clamp(min=1.0)).all(), (
        chain.tolist(), logits.argmax(-1).tolist())
    # DSpark's confidence head (adaptive verification's acceptance estimate)
    assert (seen["confidence"] is None) == ("confidence" not in theirs)
    if "confidence" in theirs:
        assert close(seen["confidence"], theirs["confidence"])
