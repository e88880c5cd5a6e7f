"""Pure-torch draft-tree core: tree tensors, correction heads (Domino, DSpark Markov) behind
one protocol, builders, acceptance; ``gdn``: tree rows through a Gated-DeltaNet layer (the
torch path of hybrid targets on vLLM's CPU GDN op, and the twin of ``kernels/gdn_tree.py``)."""

from vllm_dartree.tree.accept import AcceptResult, accept_tree
from vllm_dartree.tree.build import VARIANTS, build_tree, stable_topk
from vllm_dartree.tree.correction import DominoHead
from vllm_dartree.tree.heads import CorrectionHead
from vllm_dartree.tree.markov import MarkovHead
from vllm_dartree.tree.sampling import (
    GREEDY_TEMPERATURE,
    choose_tokens,
    filter_top_k_top_p,
    race_sample,
    sample_every_node,
)
from vllm_dartree.tree.types import (
    DraftTree,
    ancestor_mask,
    causal_rows,
    chain_tree,
    depth_first,
    pack_bool_mask,
    packed_ancestor_mask,
    select_requests,
    stack_trees,
    truncate,
    verify_positions,
    verify_tokens,
    verify_visibility,
    where_requests,
)

__all__ = [
    "GREEDY_TEMPERATURE",
    "VARIANTS",
    "AcceptResult",
    "CorrectionHead",
    "DominoHead",
    "DraftTree",
    "MarkovHead",
    "accept_tree",
    "ancestor_mask",
    "build_tree",
    "causal_rows",
    "chain_tree",
    "choose_tokens",
    "depth_first",
    "filter_top_k_top_p",
    "pack_bool_mask",
    "packed_ancestor_mask",
    "race_sample",
    "sample_every_node",
    "select_requests",
    "stable_topk",
    "stack_trees",
    "truncate",
    "verify_positions",
    "verify_tokens",
    "verify_visibility",
    "where_requests",
]
