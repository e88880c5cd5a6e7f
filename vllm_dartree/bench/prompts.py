"""Token ids of a benchmark turn: the chat template with thinking off, as the references do.

``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
enable_thinking=False)`` then encoding without added special tokens (the template already
carries them). Templates without an ``enable_thinking`` switch ignore the extra variable.
Multi-turn samples (mt-bench) get each generated answer appended as an assistant message
before the next user turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_dartree.bench.datasets import Sample

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(model_dir: str | Path) -> bool:
    path = Path(model_dir)
    return not path.is_dir() or any((path / name).exists() for name in TOKENIZER_FILES)


class PromptBuilder:
    """Builds prompt ids per turn; ``tokenizer`` None means token-id samples only."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def for_model(cls, model_dir: str | Path) -> PromptBuilder:
        if not has_tokenizer(model_dir):
            return cls(None)
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    @property
    def eos_token_id(self) -> int | None:
        return None if self.tokenizer is None else self.tokenizer.eos_token_id

    def turn_ids(self, sample: Sample, answers: list[list[int]]) -> list[int]:
        """Prompt of turn ``len(answers)``: previous turns with their generated answers."""
        if sample.prompt_ids is not None:
            return list(sample.prompt_ids)
        if self.tokenizer is None:
            raise ValueError(
                f"dataset {sample.dataset!r} is text but the target has no tokenizer: use "
                "--datasets random (token-id prompts) with this target"
            )
        messages: list[dict[str, str]] = []
        for turn, answer in zip(sample.turns, answers):
            messages += [{"role": "user", "content": turn},
                         {"role": "assistant", "content": self.decode(answer)}]
        messages.append({"role": "user", "content": sample.turns[len(answers)]})
        return self.chat_ids(messages)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_texts(self, ids: list[int]) -> list[str] | None:
        """Each token on its own (for tree drawings); None without a tokenizer."""
        if self.tokenizer is None:
            return None
        return [self._piece(i) for i in ids]

    def _piece(self, token_id: int) -> str:
        """Decoded text, or the vocabulary entry for byte fragments that decode to U+FFFD."""
        text = self.tokenizer.decode([token_id])
        return str(self.tokenizer.convert_ids_to_tokens(token_id)) if "\ufffd" in text else text

    def length_bound(self, sample: Sample, max_new_tokens: int) -> int:
        """Upper bound on the context a sample reaches (all turns, answers at full length)."""
        if sample.prompt_ids is not None:
            return len(sample.prompt_ids) + max_new_tokens
        user = sum(len(self.tokenizer(t, add_special_tokens=False)["input_ids"])
                   for t in sample.turns)
        first = len(self.turn_ids(Sample(sample.dataset, 0, sample.turns[:1]), []))
        overhead = max(first - len(self.tokenizer(sample.turns[0], add_special_tokens=False)
                                   ["input_ids"]), 0)
        # Each turn adds its template overhead again (system prompt included: an overestimate).
        return user + sample.num_turns * (overhead + max_new_tokens + 8)
