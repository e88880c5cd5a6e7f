"""The timed generation loop: requests through an in-process engine, step by step.

Requests are added to ``llm.llm_engine`` (at most ``batch_size`` at once; 1 = one request at a
time) and the loop calls ``step()`` itself, so every engine step is timed and every step in
which a request gained tokens is an event ``(time since add, tokens so far, step)``. The first
event is the first token (prefill, plus the drafter's first proposal); later events are the
decode rounds. Multi-turn samples queue their next turn as soon as a turn finishes.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_dartree.bench.datasets import Sample
from vllm_dartree.bench.prompts import PromptBuilder
from vllm_dartree.bench.recorder import RoundRecorder


@dataclass(frozen=True)
class GenSettings:
    max_new_tokens: int
    temperature: float
    max_model_len: int
    eos_token_id: int | None = None
    ignore_eos: bool = False
    batch_size: int = 1
    seed: int = 0
    draft_slots: int = 0  # B (or the chain length): context kept free for verify rows


@dataclass
class Conversation:
    sample: Sample
    answers: list[list[int]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.answers) >= self.sample.num_turns


@dataclass
class ActiveTurn:
    conversation: Conversation
    prompt_ids: list[int]
    added: float
    events_t: list[float] = field(default_factory=list)
    events_n: list[int] = field(default_factory=list)
    events_step: list[int] = field(default_factory=list)


def request_seed(settings: GenSettings, sample: Sample, turn: int) -> int:
    key = f"{settings.seed}/{sample.dataset}/{sample.source_index}/{turn}".encode()
    return zlib.crc32(key)


def sampling_params(settings: GenSettings, prompt_len: int, seed: int):
    from vllm import SamplingParams

    room = settings.max_model_len - prompt_len - settings.draft_slots - 1
    max_tokens = max(1, min(settings.max_new_tokens, room))
    stop = [] if settings.ignore_eos or settings.eos_token_id is None else [settings.eos_token_id]
    return SamplingParams(
        temperature=settings.temperature, max_tokens=max_tokens, ignore_eos=settings.ignore_eos,
        stop_token_ids=stop, seed=None if settings.temperature == 0 else seed, detokenize=False,
    )


def start_turn(engine: Any, request_id: str, conversation: Conversation,
               builder: PromptBuilder, settings: GenSettings) -> ActiveTurn:
    from vllm.inputs import TokensPrompt

    sample, turn = conversation.sample, len(conversation.answers)
    ids = builder.turn_ids(sample, conversation.answers)
    params = sampling_params(settings, len(ids), request_seed(settings, sample, turn))
    active = ActiveTurn(conversation, ids, time.perf_counter())
    engine.add_request(request_id, TokensPrompt(prompt_token_ids=ids), params)
    return active


def run_conversations(llm: Any, samples: list[Sample], builder: PromptBuilder,
                      settings: GenSettings, recorder: RoundRecorder, speculative: bool,
                      keep_trees: Callable[[Sample], bool] | None = None,
                      progress: Any = None) -> list[Conversation]:
    """Generate every turn of every sample; returns the conversations in sample order.

    ``keep_trees(sample)``: whether the recorder keeps whole trees of that sample's turns.
    """
    engine = llm.llm_engine
    conversations = [Conversation(s) for s in samples]
    pending = deque(conversations)
    active: dict[str, ActiveTurn] = {}
    ids = (f"q{i}" for i in itertools.count())
    while pending or active:
        while pending and len(active) < settings.batch_size:
            request_id, conversation = next(ids), pending.popleft()
            if keep_trees is not None and keep_trees(conversation.sample):
                recorder.keep_requests.add(request_id)
            active[request_id] = start_turn(engine, request_id, conversation, builder, settings)
        recorder.step += 1
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            turn = active.get(output.request_id)
            if turn is None:
                continue
            _observe(turn, output, now, recorder.step)
            if output.finished:
                del active[output.request_id]
                _finish(turn, output, recorder.pop(output.request_id), speculative)
                if not turn.conversation.done:
                    pending.appendleft(turn.conversation)
                elif progress is not None:
                    progress.update(1)
    return conversations


def _observe(turn: ActiveTurn, output: Any, now: float, step: int) -> None:
    count = len(output.outputs[0].token_ids)
    if count > (turn.events_n[-1] if turn.events_n else 0):
        turn.events_t.append(now - turn.added)
        turn.events_n.append(count)
        turn.events_step.append(step)


def _finish(turn: ActiveTurn, output: Any, rounds: list[dict[str, Any]],
            speculative: bool) -> None:
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    rows = join_rounds(turn, rounds) if speculative else ar_rounds(turn)
    sequence = turn.prompt_ids + ids
    trees = [row.pop("tree") | {"round": k} | tree_ends(turn, sequence, row)
             for k, row in enumerate(rows) if "tree" in row]
    turn.conversation.turns.append({
        "prompt_len": len(turn.prompt_ids),
        "output_ids": ids,
        "finish_reason": completion.finish_reason,
        "events_t": [round(t, 6) for t in turn.events_t],
        "events_n": turn.events_n,
        "rounds": columns(rows),
        "trees": trees,
    })
    turn.conversation.answers.append(ids)


ROUND_FIELDS = ("step", "accept", "emitted", "time_s", "nodes", "depth_counts")


def columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per-round records stored column-wise (compact ``results.json``)."""
    return {name: [row.get(name) for row in rows] for name in ROUND_FIELDS}


def join_rounds(turn: ActiveTurn, rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attach the step's wall time and committed tokens to each recorded verify round."""
    at = {step: k for k, step in enumerate(turn.events_step)}
    for record in rounds:
        k = at.get(record["step"])
        if not k:  # no event (nothing committed) or the prefill step
            record["time_s"], record["emitted"] = None, 0
            continue
        record["time_s"] = round(turn.events_t[k] - turn.events_t[k - 1], 6)
        record["emitted"] = turn.events_n[k] - turn.events_n[k - 1]
    return rounds


def ar_rounds(turn: ActiveTurn) -> list[dict[str, Any]]:
    """Target-only decoding: every decode step is a round committing its tokens (1)."""
    out = []
    for k in range(1, len(turn.events_t)):
        emitted = turn.events_n[k] - turn.events_n[k - 1]
        out.append({"step": turn.events_step[k], "accept": emitted, "emitted": emitted,
                    "nodes": 0, "depth_counts": [],
                    "time_s": round(turn.events_t[k] - turn.events_t[k - 1], 6)})
    return out


def tree_ends(turn: ActiveTurn, sequence: list[int], row: dict[str, Any]) -> dict[str, Any]:
    """A round's root (the last token committed before its step) and bonus token (the
    target's token after the accepted path, when the round was not cut by a stop)."""
    before = [n for n, s in zip(turn.events_n, turn.events_step) if s < row["step"]]
    if not before:
        return {"root": None, "bonus": None}
    start = len(turn.prompt_ids) + before[-1]
    bonus = sequence[start + row["accept"] - 1] if row["emitted"] == row["accept"] else None
    return {"root": sequence[start - 1], "bonus": bonus}
