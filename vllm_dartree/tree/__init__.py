"""Pure-torch draft-tree core: tree tensors, Domino correction head, builders, acceptance."""

from vllm_dartree.tree.accept import AcceptResult, accept_tree, race_sample, sample_every_node
from vllm_dartree.tree.build import VARIANTS, build_tree, stable_topk
from vllm_dartree.tree.correction import DominoHead
from vllm_dartree.tree.types import (
    DraftTree,
    ancestor_mask,
    pack_bool_mask,
    packed_ancestor_mask,
    verify_positions,
    verify_tokens,
)

__all__ = [
    "VARIANTS",
    "AcceptResult",
    "DominoHead",
    "DraftTree",
    "accept_tree",
    "ancestor_mask",
    "build_tree",
    "pack_bool_mask",
    "packed_ancestor_mask",
    "race_sample",
    "sample_every_node",
    "stable_topk",
    "verify_positions",
    "verify_tokens",
]
