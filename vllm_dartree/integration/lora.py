"""LoRA: the drafter reads the target's base embedding and lm_head, never an adapter.

With ``enable_lora``, vLLM wraps the target's modules (``BaseLayerWithLoRA``) before the
drafter loads, and the drafter shares the target's embedding (and, for DFlash, its
lm_head). A wrapped module reads the current batch's LoRA mapping, laid out for the
target's tokens, so the drafter's own calls (its block queries, the correction head's
[V, 3G] input-gate table) index past it. The drafter was trained on the base model, and
the target's rows are verified with each request's adapter (vLLM maps every scheduled
row, tree rows included, to its request's adapter), so the drafter takes the base
modules, as vLLM's V2 EAGLE speculators do (``eagle/utils.py``).
"""

from __future__ import annotations

import functools
import logging

import numpy as np
from torch import nn

from vllm_dartree.integration.patching import Runner, VllmPatch
from vllm_dartree.integration.touchpoints import V2_RUNNER

logger = logging.getLogger("vllm.dartree")

SHARED_MODULES = ("embed_tokens", "embedding", "lm_head")


def use_base_layers(drafter: nn.Module) -> list[str]:
    """Replace every LoRA-wrapped module the drafter shares with the target by its base
    layer; -> the names replaced (logged)."""
    from vllm.lora.layers.base import BaseLayerWithLoRA

    replaced = []
    for owner_name, owner in drafter.named_modules():
        for name in SHARED_MODULES:
            module = owner._modules.get(name)
            if isinstance(module, BaseLayerWithLoRA):
                setattr(owner, name, module.base_layer)
                replaced.append(f"{owner_name}.{name}".lstrip("."))
    if replaced:
        logger.info("dartree: the drafter reads the target's base %s (no LoRA adapter)",
                    ", ".join(replaced))
    return replaced


# vLLM 0.32/0.33's V2 runner maps the lm_head's LoRA one id per request, while a step with
# drafts has 1 + drafts logits rows per request: compute_logits then fails (any spec
# method). vLLM 0.34 maps one id per logits row (``make_lora_inputs(..., num_logits)``);
# these two patches do the same on the releases before it.
LOGITS_ROWS_ATTR = "dartree_logits_rows"  # on V2's LoraState: [num_reqs] logits rows
V2_LORA_ROWS_RELEASES = ("0.32.0", "0.33.0")


class StepLogitsRows(VllmPatch):
    """V2 ``GPUModelRunner.prepare_inputs``: note each request's logits rows for the LoRA
    mapping vLLM builds from the same batch right after."""

    target = V2_RUNNER
    attribute = "prepare_inputs"
    releases = V2_LORA_ROWS_RELEASES
    runner = Runner.V2

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def prepare_inputs(self, *args, **kwargs):
            input_batch = original(self, *args, **kwargs)
            if self.lora_config is not None:
                cu = input_batch.cu_num_logits_np[: input_batch.num_reqs + 1]
                setattr(self.lora_state, LOGITS_ROWS_ATTR, np.diff(cu))
            return input_batch

        return prepare_inputs


class LoraIdPerLogitsRow(VllmPatch):
    """V2 ``LoraState.make_lora_inputs``: the lm_head's LoRA ids one per logits row (the
    counts :class:`StepLogitsRows` noted for this batch, consumed)."""

    target = "vllm.v1.worker.gpu.lora_utils:LoraState"
    attribute = "make_lora_inputs"
    releases = V2_LORA_ROWS_RELEASES
    runner = Runner.V2

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def make_lora_inputs(self, req_ids, idx_mapping, num_scheduled_tokens):
            prompt, tokens, requests = original(self, req_ids, idx_mapping,
                                                num_scheduled_tokens)
            rows = self.__dict__.pop(LOGITS_ROWS_ATTR, None)
            if rows is not None and len(rows) == len(prompt):
                prompt = tuple(np.repeat(np.asarray(prompt), rows).tolist())
            return prompt, tokens, requests

        return make_lora_inputs


V2_LORA_PATCHES = (StepLogitsRows, LoraIdPerLogitsRow)
