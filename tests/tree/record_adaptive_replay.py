"""Writes ``tests/tree/data/adaptive_replay.json``: adaptive verification's decisions over the
runs of ``adaptive_replay.py`` and how often each of its mechanisms fired, which must be
every one of them at least once.

    PYTHONPATH=. python tests/tree/record_adaptive_replay.py

The pause policy's transitions are its own counts (``PausePolicy.fired``); the trace was
first recorded from the policy before it was split (issue 48, item 4), counting them by
wrapping its private methods (this script as of commit b889559), and this script writes the
same file. The other mechanisms are
counted from what the policy's callers see.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from adaptive_replay import TRACE, replay  # noqa: E402

from vllm_dartree.tree.adaptive import AdaptiveVerification  # noqa: E402


def watch_public_calls(policy: AdaptiveVerification, fired: Counter) -> None:
    """Count into ``fired`` the back-off's doublings and resets, the drafted probes that run
    where the back-off is at its maximum (no test of whether a tree could pay), and the
    choices that take their count from a probe rule."""
    should_draft, choose = policy.should_draft, policy.choose
    last = {"drafted": True}

    def watched(call, *args):
        before = policy.pause.backoff
        result = call(*args)
        after = policy.pause.backoff
        fired["back-off doubled"] += after > before
        fired["back-off reset"] += after < before
        return result

    def watched_should_draft(requests):
        drafts = watched(should_draft, requests)
        if drafts and not last["drafted"] and policy.pause.backoff == policy.pause.max_off_steps:
            fired["probe at the largest back-off"] += 1
        last["drafted"] = drafts
        return drafts

    def watched_choose(tree):
        if policy.steps < policy.start_up_steps:
            fired["start-up count"] += 1
        elif policy.excursion_every and policy.steps % policy.excursion_every == 0:
            more = policy.steps // policy.excursion_every % 2
            fired["probe count: n* and a quarter more" if more else "probe count: none"] += 1
        if policy.steps >= policy.start_up_steps and policy.cost.tree_steps < policy.trusted_after:
            fired["young fit: a quarter at least"] += 1
        return watched(choose, tree)

    policy.should_draft, policy.choose = watched_should_draft, watched_choose


def replay_counting() -> tuple[dict[str, list], dict[str, int]]:
    """The replayed runs, and how often each mechanism fired in them."""
    fired: Counter = Counter()
    policies: list[AdaptiveVerification] = []
    runs = replay(lambda policy: (policies.append(policy), watch_public_calls(policy, fired)))
    for policy in policies:
        fired.update(policy.pause.fired)  # the pause policy's transitions, by rule
    mechanisms = dict(sorted(fired.items()))
    mechanisms.update(observed_mechanisms(runs))
    return runs, mechanisms


def main() -> None:
    runs, mechanisms = replay_counting()
    missing = [name for name, count in mechanisms.items() if count == 0]
    assert not missing, missing
    write(runs, mechanisms)
    print(json.dumps(mechanisms, indent=1), TRACE.stat().st_size, "bytes")


def observed_mechanisms(runs: dict[str, list]) -> dict[str, int]:
    counts: Counter = Counter()
    for records in runs.values():
        previous = None
        for record in records:
            counts["steps"] += 1
            counts["drafted"] += record["d"]
            counts["idle gap left out"] += record.get("k") is False
            if previous is not None:
                counts["width changed"] += record["w"] != previous["w"]
                counts["pause started"] += previous["d"] and not record["d"]
                counts["drafted after a pause"] += record["d"] and not previous["d"]
            counts["no node chosen"] += record["d"] and not any(record["c"])
            previous = record
    return dict(counts)


def write(runs: dict[str, list], mechanisms: dict[str, int]) -> None:
    """One step a line, so that a change of decisions shows as a readable diff."""
    lines = ["{", f' "mechanisms": {json.dumps(mechanisms)},', ' "runs": {']
    for r, (name, records) in enumerate(runs.items()):
        lines.append(f"  {json.dumps(name)}: [")
        lines.extend("   " + json.dumps(record, separators=(",", ":"))
                     + ("," if i < len(records) - 1 else "") for i, record in enumerate(records))
        lines.append("  ]" + ("," if r < len(runs) - 1 else ""))
    lines += [" }", "}"]
    TRACE.parent.mkdir(exist_ok=True)
    TRACE.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
