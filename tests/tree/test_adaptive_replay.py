"""Adaptive verification decides as recorded: the runs of ``adaptive_replay.py`` (random trees,
batches that grow and shrink, cost regimes where trees pay, do not pay and change mid-run)
replayed through the policy give the decisions in ``data/adaptive_replay.json``: whether
each step drafts, the counts chosen, the auto width, and what the budget report reads.

A change to the policy that is meant to keep its decisions must pass this unchanged; one that
changes them on purpose re-records the trace (``record_adaptive_replay.py``) and says why.
"""

import json

import pytest
from adaptive_replay import TRACE, replay
from record_adaptive_replay import replay_counting

FLOATS = {"e", "t", "g"}  # expected tokens, predicted ms, gain scale (rounded, 6 digits)

# Each must fire at least once in the recorded runs (record_adaptive_replay.py counts them).
MECHANISMS = {
    "not paying", "vetoed", "no tree could pay",  # the three reasons to pause
    "pause over", "batch shrank",  # a pause ends after its back-off, or early
    "approved", "approved under veto",  # a drafted step judged worth it
    "back-off doubled", "back-off reset", "probe at the largest back-off",
    "start-up sample", "plain sampling", "plain sampled",  # steps without drafting that measure
    "start-up count", "probe count: n* and a quarter more", "probe count: none",
    "young fit: a quarter at least",
    "width changed", "idle gap left out", "no node chosen", "drafted after a pause",
}


def load() -> dict:
    return json.loads(TRACE.read_text())


def same(got: dict, want: dict) -> bool:
    if got.keys() != want.keys():
        return False
    for key, value in want.items():
        if key in FLOATS:
            if got[key] != pytest.approx(value, rel=1e-5):
                return False
        elif key == "r":  # calibration errors, the cost model's description, sample counts
            if got[key][:2] != pytest.approx(value[:2], rel=1e-5, abs=1e-9) or (
                    got[key][2:] != value[2:]):
                return False
        elif got[key] != value:
            return False
    return True


def test_the_replay_exercises_every_mechanism_as_recorded():
    """Counted live as the policy replays the runs (a policy that stops reaching a mechanism
    fails here, whatever the recorded file says), and as often as recorded."""
    runs, mechanisms = replay_counting()
    missing = sorted(name for name in MECHANISMS if not mechanisms.get(name))
    assert not missing, missing
    assert mechanisms == load()["mechanisms"]
    check_decisions(runs)


def check_decisions(runs: dict[str, list]) -> None:
    """``runs`` decide as the recorded trace does, step by step."""
    recorded = load()["runs"]
    assert runs.keys() == recorded.keys()
    for name, records in recorded.items():
        assert len(runs[name]) == len(records), name
        for step, (got, want) in enumerate(zip(runs[name], records)):
            assert same(got, want), (name, step, got, want)


def test_the_policy_decides_as_recorded():
    """Without the counting wrappers: the policy as the engine calls it."""
    check_decisions(replay())
