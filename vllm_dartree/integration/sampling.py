"""``logit_bias`` and ``min_p`` on a dartree engine.

vLLM refuses both on any speculative engine (``SamplingParams._validate_spec_decode``): its
V1 rejection sampler leaves them out of the draft rows. A dartree engine applies them:

- V2: every target row goes through vLLM's own ``Sampler.apply_sampling_params`` (the tree
  sampler's ``sample`` and V2's rejection sampler alike), which applies both;
- V1: tree rows get both (and allowed token ids) before the tree verifier chooses, bonus
  rows and steps without drafts from vLLM's built-in processors, and the draft rows of a
  request verified as a chain (``verify_plan.verifies_as_chain_on_v1``) inside vLLM's
  rejection sampler; each where and as target-only's sampler applies it
  (``v1/sampling.py``).

:class:`SpecDecodeSamplingCheck` lifts vLLM's refusal for dartree engines only: any other
speculative config reaches vLLM's check unchanged.
"""

from __future__ import annotations

import functools

from vllm_dartree.config import carried_settings
from vllm_dartree.integration.patching import Runner, VllmPatch
from vllm_dartree.integration.touchpoints import ALL_RELEASES


class SpecDecodeSamplingCheck(VllmPatch):
    """``SamplingParams._validate_spec_decode``: nothing to refuse for a dartree engine
    (both parameters are applied, see the module); vLLM's own check for any other."""

    target = "vllm.sampling_params:SamplingParams"
    attribute = "_validate_spec_decode"
    releases = ALL_RELEASES
    runner = Runner.BOTH

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _validate_spec_decode(self, speculative_config):
            if carried_settings(speculative_config) is not None:
                return None
            return original(self, speculative_config)

        return _validate_spec_decode
