"""vLLM 0.34+: "dartree" as a registered speculative method (vLLM's custom-speculator API).

``gate.MethodRegistration`` registers :class:`DARTreeSpeculatorConfig` at plugin load
in every process. vLLM then moves ``method="dartree"`` to ``custom_method``, sets ``method``
to this config's base method ("dflash": the drafter's config, its KV cache and the target's
aux hidden states are DFlash's) and builds ``speculator_class``. The dartree settings are
validated and attached by the request gate before vLLM sees the config (flat keys, or 0.34's
``speculator_options``, which the gate unnests), so this class adds no option of its own:
``config.carry_settings`` says why they do not travel as vLLM's ``speculator_options``.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.dflash.config import DFlashSpeculatorConfig


class DARTreeSpeculatorConfig(DFlashSpeculatorConfig):
    speculator_class = "vllm_dartree.integration.v2.speculator.DARTreeSpeculator"
    # Watermarking biases each draft position's sampling, which tree verification does not
    # apply (refused with a message by the gate; vLLM checks this flag too).
    supports_watermarking = False
