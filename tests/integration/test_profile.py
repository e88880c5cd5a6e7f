"""The round profile: phases timed per round, the span from the target's forward to
acceptance, and the report's host/other remainder."""

from __future__ import annotations

import time

from vllm_dartree.bench.report import profile_rows
from vllm_dartree.step.profile import PHASES, StepProfile


def test_phases_spans_and_the_remainder_per_round():
    with StepProfile.recording() as rounds:
        for _ in range(2):
            StepProfile.new_round()
            with StepProfile.phase("target_forward"):
                time.sleep(0.004)
            start = StepProfile.stamp()
            time.sleep(0.003)
            StepProfile.since("target_logits", start)
            with StepProfile.phase("accept"):
                time.sleep(0.001)
        StepProfile.new_round()  # closes the second round
    assert len(rounds) == 2
    for r in rounds:
        assert r["target_forward"] >= 4 and r["target_logits"] >= 3 and r["accept"] >= 1
        assert r["round"] >= r["target_forward"] + r["target_logits"] + r["accept"]
    row = profile_rows({"profile": [{"method": "dartree-pruned", "rounds": rounds}]})
    medians = row["dartree-pruned"]
    counted = medians["target_forward"] + medians["target_logits"] + medians["accept"]
    assert abs(medians["host"] - (medians["round"] - counted)) < 1e-9
    assert set(PHASES) <= set(medians)


def test_a_round_without_a_target_forward_is_not_recorded():
    with StepProfile.recording() as rounds:
        StepProfile.new_round()
        StepProfile.since("target_logits", StepProfile.stamp())
        StepProfile.new_round(tree_step=False)
        StepProfile.new_round()
    assert rounds == []
