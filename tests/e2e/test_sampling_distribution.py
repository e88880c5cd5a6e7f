"""With T = 1, tokens emitted through tree verification follow the target's distribution."""

from __future__ import annotations

import itertools

import pytest
import torch

from vllm_dartree.harness.engine import generate_ids
from vllm_dartree.models.tiny import DrafterSpec, TargetSpec, write_drafter, write_target

pytestmark = pytest.mark.e2e

# A handful of tokens, so trees cover much of the vocabulary and sampled paths go deep.
SPEC = TargetSpec(vocab_size=8, seed=5, init_std=0.25)
PROMPT = [3, 1, 4, 1, 5]
SAMPLES = 1000


def exact_marginals(target) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t2) and P(t3) of target-only sampling at T = 1, by enumerating t1 (and t2)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)

    @torch.no_grad()
    def next_probs(prefixes):
        logits = model(torch.tensor(prefixes)).logits[:, -1]
        return logits.softmax(-1).double()

    vocab = SPEC.vocab_size
    p1 = next_probs([PROMPT])[0]
    p2_given = next_probs([PROMPT + [a] for a in range(vocab)])  # [t1, t2]
    joint12 = p1.unsqueeze(1) * p2_given
    pairs = list(itertools.product(range(vocab), repeat=2))
    p3_given = next_probs([PROMPT + [a, b] for a, b in pairs]).view(vocab, vocab, vocab)
    return joint12.sum(0), (joint12.unsqueeze(2) * p3_given).sum((0, 1))


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    from scipy.stats import chisquare

    expected = probs * counts.sum()
    keep = expected >= 5  # pool sparse cells so the chi-square approximation holds
    observed = torch.cat([counts[keep], counts[~keep].sum().view(1)]).double()
    wanted = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    wanted = wanted * observed.sum() / wanted.sum()  # exact totals, as chisquare requires
    return float(chisquare(observed.numpy(), wanted.numpy()).pvalue)


@pytest.mark.parametrize("budget_policy", ["fixed", "adaptive"])
def test_sampled_tokens_follow_the_target(engines, budget_policy):
    """Also with adaptive verification, whose node counts (so which rows draw from a request's
    generator) follow the clock: seeded outputs need not repeat, the distribution must."""
    from vllm import SamplingParams

    target = write_target(SPEC)
    drafter = write_drafter(DrafterSpec(target=SPEC, domino=True))
    p2, p3 = exact_marginals(target)
    llm = engines.get(
        model=str(target), max_num_seqs=64, max_num_batched_tokens=4096,
        speculative_config={"method": "dartree", "model": str(drafter),
                            "num_speculative_tokens": 16, "width": 8,
                            "budget_policy": budget_policy},
    )
    sampling = [SamplingParams(temperature=1.0, seed=seed, max_tokens=4, ignore_eos=True)
                for seed in range(SAMPLES)]
    import time
    start = time.perf_counter()
    outputs = torch.tensor(generate_ids(llm, [PROMPT] * SAMPLES, sampling))
    print(f"generation {time.perf_counter() - start:.1f} s")
    assert outputs.shape == (SAMPLES, 4)
    vocab = SPEC.vocab_size
    counts2 = torch.bincount(outputs[:, 1], minlength=vocab)
    counts3 = torch.bincount(outputs[:, 2], minlength=vocab)
    assert chi_square_p(counts2, p2) > 1e-3, (counts2, p2 * SAMPLES)
    assert chi_square_p(counts3, p3) > 1e-3, (counts3, p3 * SAMPLES)
    # The test has power: a wrong distribution (off by one token) is rejected.
    assert chi_square_p(counts2, p2.roll(1)) < 1e-3
