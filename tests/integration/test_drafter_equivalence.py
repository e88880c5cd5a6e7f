"""The drafter inside vLLM computes what the public reference code computes, on the same weights.

vLLM's side: a dartree engine (``tree: chain``) on the tiny target, with the first drafter call
after a single prompt's prefill captured from ``DARTreeProposer`` (context features, root,
positions, per-depth hidden states, the proposed chain). Reference side:
``tests/reference/dflash_reference.py``, an independent pure-torch re-implementation of the
HF ``DFlashDraftModel`` / Domino ``spec_generate``, loading the checkpoint's safetensors by the
released names, with the target run by transformers. Everything is float32; tolerances are
1e-4 of the compared quantity's scale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import dflash_reference as ref
import pytest
import torch

from vllm_dartree.harness.engine import generate_ids
from vllm_dartree.models.tiny import TargetSpec, random_prompts
from vllm_dartree.tree import build_tree

pytestmark = pytest.mark.e2e

VOCAB = TargetSpec().vocab_size
PROMPT = random_prompts(1, VOCAB, seed=31, min_len=23, max_len=23)[0]
REL_TOL = 1e-4


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> float:
    """Max |actual - expected| must be <= REL_TOL * max(1, max |expected|); returns it."""
    actual, expected = actual.detach().float().cpu(), expected.detach().float().cpu()
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    diff = (actual - expected).abs().max().item()
    scale = max(1.0, expected.abs().max().item())
    print(f"{what}: max |diff| {diff:.2e} (scale {scale:.3g})")
    assert diff <= REL_TOL * scale, f"{what}: max diff {diff:.3g} > {REL_TOL} x scale {scale:.3g}"
    return diff


@dataclass
class Captured:
    """The first ``DARTreeProposer`` call of a request, as vLLM ran it."""

    proposer: object
    target_token_ids: torch.Tensor  # [L]
    target_positions: torch.Tensor  # [L]
    target_hidden_states: torch.Tensor  # [L, n*H] concatenated aux hidden states
    next_token_ids: torch.Tensor  # [1] the root
    query_positions: torch.Tensor  # [block] positions the drafter's queries ran at
    depth_hidden: torch.Tensor  # [1, D, H] the depths of what _draft_block returned
    tree_tokens: torch.Tensor  # [1, B] what propose returned


def capture_first_draft(llm, prompt: list[int]) -> Captured:
    """Generate a few tokens for ``prompt`` and capture the first drafter call."""
    from vllm import SamplingParams

    from vllm_dartree.integration.v1.proposer import DARTreeProposer

    seen: dict = {}
    draft_block, propose = DARTreeProposer._draft_block, DARTreeProposer.propose

    def capturing_draft_block(self, target_token_ids, target_positions, target_hidden_states,
                              next_token_ids, cad, num_rejected_tokens_gpu):
        out = draft_block(self, target_token_ids, target_positions, target_hidden_states,
                          next_token_ids, cad, num_rejected_tokens_gpu)
        if "depth_hidden" not in seen:
            block = self.layout.block_size
            seen.update(
                proposer=self,
                target_token_ids=target_token_ids.clone(),
                target_positions=target_positions.clone(),
                target_hidden_states=target_hidden_states.clone(),
                next_token_ids=next_token_ids.clone(),
                query_positions=self.positions[:block].clone(),
                depth_hidden=self.depth_hidden_of(out).clone(),
            )
        return out

    def capturing_propose(self, *args, **kwargs):
        tokens = propose(self, *args, **kwargs)
        seen.setdefault("tree_tokens", tokens.clone())
        return tokens

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DARTreeProposer, "_draft_block", capturing_draft_block)
        patch.setattr(DARTreeProposer, "propose", capturing_propose)
        generate_ids(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=4,
                                                   ignore_eos=True))
    assert "tree_tokens" in seen, "the engine never called the drafter"
    return Captured(**seen)


@dataclass
class Side:
    captured: Captured
    target: ref.TargetPrefill
    model: ref.DFlashDraftModel
    block: ref.DraftBlock
    root: int


@pytest.fixture(scope="module")
def target_prefill(tiny_target) -> ref.TargetPrefill:
    return ref.prefill_target(tiny_target, PROMPT)


def run_both(engines, tiny_target, target: ref.TargetPrefill, drafter, **settings) -> Side:
    spec = {"method": "dartree", "model": str(drafter), "tree": "chain",
            "num_speculative_tokens": 16,  # a chain over every drafted depth
            "top_k": VOCAB, **settings}  # top_k = V: the chain is the full-vocabulary argmax
    captured = capture_first_draft(engines.get(model=str(tiny_target), speculative_config=spec),
                                   PROMPT)
    root = int(target.logits[-1].argmax())
    model = ref.load_drafter(drafter)
    return Side(captured, target, model, ref.draft_block(model, target, len(PROMPT), root), root)


@pytest.fixture(scope="module")
def domino(engines, tiny_target, target_prefill, tiny_domino) -> Side:
    return run_both(engines, tiny_target, target_prefill, tiny_domino, correction=True)


@pytest.fixture(scope="module")
def zlab(engines, tiny_target, target_prefill, tiny_dflash) -> Side:
    return run_both(engines, tiny_target, target_prefill, tiny_dflash, correction=False)


def vllm_base_logits(side: Side) -> torch.Tensor:
    proposer = side.captured.proposer
    hidden = side.captured.depth_hidden[0]
    with torch.no_grad():
        return proposer.model.compute_logits(hidden).float()


# ------------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("which", ["domino", "zlab"])
def test_first_draft_sees_the_prompt_context_and_root(request, which):
    """Context = the prompt's target layer outputs at 0..L-1, root = first generated token at L,
    fused context = hidden_norm(fc(concat)), queries at L..L+block-1."""
    side: Side = request.getfixturevalue(which)
    cap, length = side.captured, len(PROMPT)
    assert cap.target_token_ids.tolist() == PROMPT
    assert cap.target_positions.tolist() == list(range(length))
    assert cap.next_token_ids.tolist() == [side.root]
    assert cap.query_positions.tolist() == side.block.block_positions.tolist()
    features = side.target.context_features(side.model.cfg.target_layer_ids)
    assert_close(cap.target_hidden_states, features, "target context features")
    drafter = cap.proposer.model
    with torch.no_grad():
        # vLLM splits hidden_norm(fc(.)): fc in combine_hidden_states, hidden_norm where the
        # context K/V are projected (precompute_and_store_context_kv).
        combined = drafter.combine_hidden_states(cap.target_hidden_states)
        assert_close(combined, side.model.fc(features), "fc(context features)")
        fused = drafter.model.hidden_norm(combined)
        assert_close(fused, side.model.fuse_context(features), "hidden_norm(fc(context))")


def test_reference_context_is_hf_hidden_states_except_the_last_layer(target_prefill):
    """HF ``hidden_states[id + 1]`` is layer ``id``'s output for every layer but the last, whose
    entry transformers stores after the final norm (the tiny drafters use the last layer)."""
    target = target_prefill
    layers = len(target.layer_outputs)
    for i in range(layers - 1):
        assert torch.equal(target.hidden_states[i + 1], target.layer_outputs[i])
    assert not torch.allclose(target.hidden_states[layers], target.layer_outputs[-1])


# -------------------------------------------------------------------------- base logits
def test_domino_shift_layout_base_logits_match_reference(domino):
    """Domino (shift): 16 predictions from slots 0..15, slot j for position root + j + 1."""
    assert domino.model.cfg.shift_label and domino.captured.depth_hidden.shape[1] == 16
    assert_close(domino.captured.depth_hidden[0], domino.block.hidden, "depth hidden states")
    assert_close(vllm_base_logits(domino), domino.block.base_logits, "base logits")


def test_zlab_non_shift_layout_base_logits_match_reference(zlab):
    """z-lab DFlash (non-shift): 15 predictions from slots 1..15, slot j for position root + j."""
    assert not zlab.model.cfg.shift_label and zlab.captured.depth_hidden.shape[1] == 15
    assert_close(zlab.captured.depth_hidden[0], zlab.block.hidden, "depth hidden states")
    base = vllm_base_logits(zlab)
    assert_close(base, zlab.block.base_logits, "base logits")
    chain = zlab.captured.tree_tokens[0, :15]
    assert chain.tolist() == zlab.block.base_logits.argmax(-1).tolist()


# ------------------------------------------------------------------------ Domino chain
@pytest.mark.parametrize("prefix_len", [1, 0, 2])
def test_domino_corrected_chain_and_gru_states_match_reference(domino, prefix_len):
    """Greedy chain: argmax base for the first pure_draft_prefix_len slots (1 in the released
    configs; 0 and 2 exercise the other branches), then argmax of base + embed_proj(cat[z_i, s])
    with the GRU advanced over [root, d1, ...]."""
    reference = ref.domino_greedy_chain(domino.model, domino.target, domino.block, domino.root,
                                        prefix_len)
    engine_head = domino.captured.proposer.head
    assert engine_head is not None
    assert engine_head.pure_draft_prefix_len == domino.model.cfg.pure_draft_prefix_len == 1
    head = replace(engine_head, pure_draft_prefix_len=prefix_len)
    base = vllm_base_logits(domino)
    hidden = domino.captured.depth_hidden[0].float()
    tokens = base[:prefix_len].argmax(-1).tolist()
    root = torch.tensor([domino.root])
    with torch.no_grad():
        state = head.root_state(root)[0]
        for token in tokens:
            state = head.advance(state, torch.tensor(token))
        corrected, states = [], []
        for i in range(prefix_len, base.shape[0]):
            logits = base[i] + head.full_bias(hidden[i], state)
            corrected.append(logits)
            states.append(state)
            tokens.append(int(logits.argmax()))
            state = head.advance(state, torch.tensor(tokens[-1]))
        tree = build_tree("chain", base[None], hidden[None], root, head, budget=64, top_k=VOCAB)
    assert_close(torch.stack(states), reference.states, "GRU states")
    assert_close(torch.stack(corrected), reference.corrected_logits, "corrected logits")
    assert tokens == reference.tokens.tolist()
    # The tree builder's chain (top_k = vocabulary) is the reference's greedy chain ...
    assert tree.tokens[0, :16].tolist() == reference.tokens.tolist()
    if prefix_len == 1:  # ... and so is the one the engine proposed.
        assert domino.captured.tree_tokens[0, :16].tolist() == reference.tokens.tolist()


def test_domino_head_weights_are_the_checkpoints(domino):
    """The head vLLM uses holds the released tensors (GRU gates r, z, n; embed_proj.0/2)."""
    head, model = domino.captured.proposer.head, domino.model
    assert torch.equal(head.gru_ih.cpu(), model.prefix_gru.weight_ih_l0)
    assert torch.equal(head.gru_hh.cpu(), model.prefix_gru.weight_hh_l0)
    assert torch.equal(head.proj0.cpu(), model.embed_proj[0].weight)
    assert torch.equal(head.proj2.cpu(), model.embed_proj[2].weight)
    # The GRU input of token v is the target's embedding row v, over the whole vocabulary.
    table = domino.target.embed @ model.prefix_gru.weight_ih_l0.T
    assert torch.allclose(head.input_gate_table.cpu(), table, atol=1e-5)


# ------------------------------------------------------------------------ DSpark chain
DSPARK_BLOCK = 7


@pytest.fixture(scope="module", params=["tiny_dspark_reduced", "tiny_dspark_shared"])
def dspark(request, engines, tiny_target, target_prefill) -> Side:
    """A DSpark-format drafter (block 7, Markov head, confidence head) as a dartree chain:
    with its own embed_tokens and lm_head and a reduced draft vocabulary (d2t), or sharing
    the target's embed_tokens and lm_head."""
    return run_both(engines, tiny_target, target_prefill, request.getfixturevalue(request.param),
                    correction=True)


def test_dspark_anchor_first_block_matches_reference(dspark):
    """Block [root, mask x 6] at positions L..L+6, every slot a prediction (7 depths), the
    block embedded with the drafter's own embed_tokens (else the target's); base logits from
    its own lm_head in the draft vocabulary (else the target's), scattered to target ids by
    d2t (-inf elsewhere)."""
    cap, block = dspark.captured, dspark.block
    assert dspark.model.cfg.shift_label and cap.depth_hidden.shape[1] == DSPARK_BLOCK
    assert cap.query_positions.tolist() == block.block_positions.tolist()
    assert_close(cap.depth_hidden[0], block.hidden, "depth hidden states")
    base = vllm_base_logits(dspark)
    kept = dspark.model.draft_to_target(torch.arange(dspark.model.cfg.draft_vocab_size))
    assert_close(base[:, kept], block.base_logits, "base logits on the draft vocabulary")
    off_draft = torch.ones(VOCAB, dtype=torch.bool).index_fill(0, kept, False)
    assert torch.isneginf(base[:, off_draft]).all()
    shared = not hasattr(dspark.model, "lm_head")
    assert shared == (dspark.captured.proposer.model.lm_head.weight.shape[0] == VOCAB
                      and torch.equal(dspark.captured.proposer.model.lm_head.weight.cpu(),
                                      dspark.target.lm_head))


def test_dspark_chain_is_dsparks_greedy_chain(dspark):
    """The engine's chain with the Markov head = DSpark's own sequential greedy chain: the
    first slot's previous token is the root, each later slot's the token drafted before."""
    reference = ref.dspark_greedy_chain(dspark.model, dspark.block, dspark.root)
    head = dspark.captured.proposer.head
    assert type(head).__name__ == "MarkovHead"
    assert torch.equal(head.markov_w1.cpu(), dspark.model.markov_head.markov_w1.weight)
    assert torch.equal(head.markov_w2.cpu(), dspark.model.markov_head.markov_w2.weight)
    drafted = dspark.captured.tree_tokens[0, :DSPARK_BLOCK]
    assert drafted.tolist() == reference.tolist()
    # The Markov bias changes this chain: without it the drafts differ.
    plain = dspark.model.draft_to_target(dspark.block.base_logits.argmax(-1))
    assert plain.tolist() != reference.tolist()
