"""The mixed-sampling batch both runners' suites run: plain greedy and seeded requests beside
requests with penalties, allowed token ids, logprobs, min_tokens, logit bias and min p (the
two vLLM refuses on other speculative engines), on the trained pair. Each request must
decode as it does target-only; every request verifies on trees (penalties counting each
row's path, min_tokens by each row's depth)."""

from __future__ import annotations

from vllm_dartree.harness.engine import spec_decode_counters
from vllm_dartree.models.tiny import random_prompts
from vllm_dartree.models.tiny_pair import TRAINED_TARGET

MAX_TOKENS = 32
VOCAB = TRAINED_TARGET.vocab_size
PROMPTS = (random_prompts(12, VOCAB, seed=31, min_len=3, max_len=30)
           + random_prompts(2, VOCAB, seed=32, min_len=3, max_len=30))
ENGINE = {"max_num_seqs": len(PROMPTS), "max_num_batched_tokens": 2048}
# The sampling parameters of each mixed request (index -> SamplingParams keys).
READERS = {
    0: {"repetition_penalty": 1.3},
    1: {"presence_penalty": 1.5, "frequency_penalty": 0.5},
    2: {"allowed_token_ids": list(range(0, VOCAB, 2))},
    3: {"logprobs": 2},
    4: {"logit_bias": {7: 2.0, 19: 1.5, 26: -3.0}},
    5: {"min_tokens": 12},  # its stop token 20 is greedy token 4 without min_tokens
    # T = 1 with min p 0.999: the argmax alone is left (this prompt's closest second is at
    # 0.996 of it), so V1's draws equal target-only's too; without min p, the seeded draw
    8: {"min_p": 0.999},
    # Logit bias and min p beside a penalty, in target-only's order on the tree rows
    12: {"repetition_penalty": 1.2, "logit_bias": {7: 2.0, 19: 1.5}},
    13: {"presence_penalty": 1.0, "min_p": 0.999},
}
# Kept when the reader's parameter is dropped.
KEPT = {5: {"stop_token_ids": [20]}, 8: {"temperature": 1.0, "seed": 9},
        13: {"temperature": 1.0, "seed": 10}}
SEEDED = {6: 7, 7: 8}  # index -> seed of a T = 0.8 request


def params(index: int, mixed: bool = True):
    from vllm import SamplingParams

    if index in SEEDED:
        return SamplingParams(temperature=0.8, seed=SEEDED[index], max_tokens=MAX_TOKENS,
                              ignore_eos=True)
    return SamplingParams(**({"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
                             | KEPT.get(index, {}) | (READERS.get(index, {}) if mixed else {})))


def generate(llm, indices: list[int], mixed: bool = True):
    """{index: (token ids, logprobs or None)} of the requests ``indices``, one batch."""
    from vllm.inputs import TokensPrompt

    outputs = llm.generate([TokensPrompt(prompt_token_ids=PROMPTS[i]) for i in indices],
                           [params(i, mixed) for i in indices], use_tqdm=False)
    return {i: (list(o.outputs[0].token_ids), o.outputs[0].logprobs)
            for i, o in zip(indices, outputs)}


def acceptance_length(llm) -> float:
    counters = spec_decode_counters(llm)
    return 1 + counters["num_accepted_tokens"] / counters["num_drafts"]


PLAIN = [i for i in range(len(PROMPTS)) if i not in READERS and i not in SEEDED]


def tree_acceptance(llm, indices: list[int], mixed: bool) -> tuple[dict, dict[int, float]]:
    """Outputs of ``indices`` in one batch, and each plain request's mean tokens per
    verified step, from the tree verifier's accepted paths (an observer)."""
    from vllm_dartree.step.verifier import TreeVerifier

    accepted: dict[str, list[int]] = {}

    def record(paths) -> None:
        for req_id, count in zip(paths.plan.req_ids, paths.num_accepted.tolist()):
            accepted.setdefault(req_id, []).append(count)

    with TreeVerifier.observing(record):
        before = set(accepted)
        out = generate(llm, indices, mixed)
    ids = sorted(set(accepted) - before, key=lambda r: int(r.split("-")[0]))
    by_index = dict(zip(indices, ids))
    return out, {i: sum(accepted[by_index[i]]) / len(accepted[by_index[i]]) for i in PLAIN}


def check_parameters_change_tokens(target_only: dict, plain: dict) -> None:
    """The fixture can fail: every reader's parameter changes its tokens (logprobs, which
    does not, is checked by value)."""
    for i, keys in READERS.items():
        if "logprobs" not in keys:
            assert target_only[i][0] != plain[i][0], keys


def check_logprobs(expected: list, found: list, tol: float = 1e-4) -> None:
    assert found is not None and len(found) == len(expected)
    for want, got in zip(expected, found):
        assert set(want) == set(got)
        for token, value in want.items():
            # A grammar's mask leaves -inf, equal on both sides.
            assert (value.logprob == got[token].logprob
                    or abs(value.logprob - got[token].logprob) <= tol)


# Structured outputs (xgrammar, vLLM's default backend) beside plain requests: a tiny target
# with a tokenizer; every third request a regex, every third a choice.
TEXT_PROMPTS = ["def foo(x):", "import os\n", "class A:", "for i in range(10):", "x = [1, 2",
                "print("]


# Request 5's bad word: two tokens its unconstrained greedy answer holds (the tiny target's
# weights are seeded); bad words verify as a chain of their own, as grammars do.
BAD_WORD = {5: "poc"}


def structured_params(index: int, constrained: bool = True):
    """A regex (every third request), a choice (every third), a bad word (request 5) or a
    plain request, each with logprobs=2 (V1: the chains give theirs, the trees theirs)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    grammar = (StructuredOutputsParams(regex=r"[a-z]+ = [0-9]+(, [0-9]+)*") if index % 3 == 0
               else StructuredOutputsParams(choice=["yes please", "no thanks", "maybe later"])
               if index % 3 == 1 else None)
    free = {"temperature": 0.0, "max_tokens": 24, "logprobs": 2}
    if not constrained:
        return SamplingParams(**free, ignore_eos=True)
    if index in BAD_WORD:  # logprobs=1: the sampled token's own entry shows when it differs
        return SamplingParams(**(free | {"logprobs": 1}), ignore_eos=True,
                              bad_words=[BAD_WORD[index]])
    if grammar is None:
        return SamplingParams(**free, ignore_eos=True)
    return SamplingParams(**free, structured_outputs=grammar)


def generate_structured(llm, constrained: bool = True) -> list[tuple[str, list | None]]:
    outputs = llm.generate(TEXT_PROMPTS, [structured_params(i, constrained)
                                          for i in range(len(TEXT_PROMPTS))], use_tqdm=False)
    return [(o.outputs[0].text, o.outputs[0].logprobs) for o in outputs]


def check_structured_outputs_beside_trees(engines) -> None:
    """Regex, choice and bad-words requests beside plain requests' trees, dartree against
    target-only on a tiny target with a tokenizer; the constraint must change every
    constrained text. Every request's logprobs equal target-only's (V1 merges the chains'
    and the trees')."""
    from vllm_dartree.models import tiny

    spec = tiny.TargetSpec(with_tokenizer=True)
    target = str(tiny.write_target(spec))
    drafter = str(tiny.write_drafter(tiny.DrafterSpec(target=spec, domino=True)))
    llm = engines.get(model=target, skip_tokenizer_init=False, max_num_seqs=8)
    expected = generate_structured(llm)
    free = generate_structured(llm, constrained=False)
    assert all(expected[i][0] != free[i][0] for i in range(len(expected))
               if i % 3 != 2 or i in BAD_WORD)
    llm = engines.get(model=target, skip_tokenizer_init=False, max_num_seqs=8,
                      speculative_config={"method": "dartree", "model": drafter})
    found = generate_structured(llm)
    assert [text for text, _ in found] == [text for text, _ in expected]
    for (_, want), (_, got) in zip(expected, found):
        check_logprobs(want, got)
