"""Small drafters for the training tests (random target tables, fixed seeds)."""

from __future__ import annotations

import torch

from vllm_dartree.checkpoint import DrafterLayout
from vllm_dartree.models.tiny import TargetSpec
from vllm_dartree.training.model import BlockDrafter

SMALL = TargetSpec(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=32, seed=5)


def small_arch(**changes) -> DrafterLayout:
    fields = dict(vocab_size=SMALL.vocab_size, hidden_size=SMALL.hidden_size,
                  intermediate_size=SMALL.intermediate_size, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  num_target_layers=2, target_layer_ids=(0, 1), mask_token_id=31,
                  block_size=16, shift_label=True, head="domino", gru_hidden_dim=24,
                  emb_dim=16, pure_draft_prefix_len=1, rope_theta=10000.0,
                  max_position_embeddings=2048)
    return DrafterLayout(**(fields | changes))


def small_markov_arch(**changes) -> DrafterLayout:
    """The same backbone as a DSpark drafter: Markov head (every slot corrected), block 7."""
    return small_arch(**({"head": "markov", "markov_rank": 8, "gru_hidden_dim": None,
                          "emb_dim": None, "pure_draft_prefix_len": 0, "block_size": 7}
                         | changes))


def small_drafter(seed: int = 0, **changes) -> BlockDrafter:
    arch = small_arch(**changes)
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(arch.vocab_size, arch.hidden_size, generator=gen)
    lm_head = torch.randn(arch.vocab_size, arch.hidden_size, generator=gen) * 0.3
    model = BlockDrafter(arch, embed, lm_head)
    model.reset_parameters(gen)
    with torch.no_grad():  # a head bias large enough to matter in comparisons
        model.head_output_weight.mul_(10)
    return model.eval()
