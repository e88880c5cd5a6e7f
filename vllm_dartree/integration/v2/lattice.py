"""DARTree over vLLM's lattice drafters, DFlash2 and LiLiCorr, on the V2 runner.

vLLM's ``DFlash2Speculator`` and ``LiLiCorrSpeculator`` are its ``DFlashSpeculator`` plus a
candidate lattice: the drafter names K candidates per depth (``model.compute_candidates``)
and its head scores every transition between them (``_score_candidates``), through which
vLLM walks one chain. A dartree engine with such a checkpoint runs a speculator that is
both :class:`~vllm_dartree.integration.v2.speculator.DARTreeSpeculator` and vLLM's own
speculator for it: vLLM's code loads the drafter (LiLiCorr: the target's embedding and LM
head), keeps LiLiCorr's anchor state and scores the lattice; the tree core grows the trees
over it (``tree.lattice``) where vLLM walks its chain. :class:`LatticeDrafting` is what such
a speculator changes; the classes are composed in ``v2/speculator.py``.
"""

from __future__ import annotations

import copy

import torch

from vllm_dartree.tree.lattice import Lattice


class LatticeDrafting:
    """What a lattice drafter changes in a DARTree speculator (first in the class order:
    over ``TreeDrafting``'s defaults and vLLM's DFlash loader)."""

    model: torch.nn.Module
    vllm_config: object
    query_slots: int

    def depth_logits(self, hidden: torch.Tensor, min_columns: int = 1
                     ) -> tuple[torch.Tensor, None]:
        """The candidate head's logits over the whole vocabulary (what DDTree and a chain
        without the lattice read); its top K are the lattice's candidates."""
        return self.model.candidate_logits_processor(self.model.lm_head, hidden), None

    def depth_lattice(self, depth_hidden: torch.Tensor, roots: torch.Tensor) -> Lattice:
        """vLLM's own lattice of the query's depths [R, D, H]: its candidates and its head's
        transition scores (``roots`` are the query's first tokens, which DFlash2's selector
        reads from vLLM's input buffer itself)."""
        num_reqs, depths, _ = depth_hidden.shape
        ids, unary = self.model.compute_candidates(depth_hidden.flatten(0, 1))
        ids = ids.view(num_reqs, depths, -1)
        scores = self._score_candidates(ids, unary.view_as(ids), depth_hidden)
        return Lattice(ids, scores.float())

    def load_draft_model(self, target_model: torch.nn.Module,
                         target_attn_layer_names: set[str]) -> torch.nn.Module:
        """vLLM's loader, for a drafter built for this speculator's query block.

        vLLM's DFlash2 and LiLiCorr models read ``num_speculative_tokens`` as their query:
        DFlash2's grouped conv mixes rows within blocks of 1 + that many, and LiLiCorr
        requires it below its trained block. A dartree query is 1 + ``query_slots`` rows
        (the budget B can exceed the block), so the drafter is built from a copy of the
        config that says so; the engine's config keeps B."""
        engine_config = self.vllm_config
        self.vllm_config = drafter_block_config(engine_config, self.query_slots)
        try:
            return super().load_draft_model(target_model, target_attn_layer_names)
        finally:
            self.vllm_config = engine_config


def drafter_block_config(vllm_config, query_slots: int):
    """A shallow copy of ``vllm_config`` whose speculative config (itself a copy) counts
    ``query_slots`` draft tokens per query."""
    block_config = copy.copy(vllm_config)
    speculative = copy.copy(vllm_config.speculative_config)
    speculative.num_speculative_tokens = query_slots  # the copy's: the engine keeps B
    block_config.speculative_config = speculative
    return block_config
