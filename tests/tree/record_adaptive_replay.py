"""Writes ``tests/tree/data/adaptive_replay.json``: the adaptive budget's decisions over the
runs of ``adaptive_replay.py`` and how often each of its mechanisms fired, which must be
every one of them at least once.

    PYTHONPATH=. python tests/tree/record_adaptive_replay.py

The pause policy's transitions are counted by wrapping ``AdaptiveBudget``'s private methods
(the policy as of the trace's recording); the others from what the policy's callers see.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from adaptive_replay import TRACE, replay  # noqa: E402

from vllm_dartree.tree.budget import AdaptiveBudget  # noqa: E402


def pause_transitions(policy: AdaptiveBudget, fired: Counter) -> None:
    """Count the pause policy's transitions into ``fired`` as ``policy`` makes them."""
    context: dict = {"in": None, "forgot": False, "paused": False, "kind": None}
    pause, pays_at = policy._pause, policy._pays_at
    update_worth, should_draft = policy._update_worth, policy.should_draft
    forget, vetoed = policy.measured.forget_drafting, policy.measured.vetoed

    def counted_pause(requests):
        if context["in"] == "should_draft":
            fired["no tree could pay"] += 1
        else:
            fired["vetoed" if context["forgot"] else "not paying"] += 1
        context["kind"], context["paused"] = "pause", True
        pause(requests)

    def counted_pays_at(requests):
        pays = pays_at(requests)  # the last test of an early end
        fired["batch shrank"] += pays
        return pays

    def counted_forget(requests):
        context["forgot"] = True
        forget(requests)

    def counted_vetoed(requests):
        held = vetoed(requests)
        if context["in"] == "update_worth":  # asked only where the model approves
            fired["approved under veto" if held else "approved"] += 1
        return held

    def counted_update_worth(requests, expected, nodes, curve):
        context.update({"in": "update_worth", "forgot": False, "paused": False})
        before = policy._off_left
        try:
            update_worth(requests, expected, nodes, curve)
        finally:
            context["in"] = None
        if policy.steps <= policy.probe_steps:
            if policy._off_left:
                fired["start-up sample"] += 1
                context["kind"] = "plain"
        elif not context["paused"] and policy._off_left != before:
            fired["plain probe"] += 1
            context["kind"] = "plain"

    def counted_should_draft(requests):
        context["in"] = "should_draft"
        before = policy._off_left
        try:
            drafts = should_draft(requests)
        finally:
            context["in"] = None
        if before > 0 and policy._off_left == 0 and not drafts:
            fired["pause over" if context["kind"] == "pause" else "plain sampled"] += 1
        return drafts

    policy._pause, policy._pays_at = counted_pause, counted_pays_at
    policy._update_worth, policy.should_draft = counted_update_worth, counted_should_draft
    policy.measured.forget_drafting, policy.measured.vetoed = counted_forget, counted_vetoed


def back_off(policy: AdaptiveBudget) -> int:
    return policy._backoff


def watch_public_calls(policy: AdaptiveBudget, fired: Counter) -> None:
    """Count into ``fired`` the back-off's doublings and resets, the drafted probes that run
    where the back-off is at its maximum (no test of whether a tree could pay), and the
    choices that take their count from a probe rule."""
    should_draft, choose = policy.should_draft, policy.choose
    last = {"drafted": True}

    def watched(call, *args):
        before = back_off(policy)
        result = call(*args)
        after = back_off(policy)
        fired["back-off doubled"] += after > before
        fired["back-off reset"] += after < before
        return result

    def watched_should_draft(requests):
        drafts = watched(should_draft, requests)
        if drafts and not last["drafted"] and back_off(policy) == policy.max_off_steps:
            fired["probe at the largest back-off"] += 1
        last["drafted"] = drafts
        return drafts

    def watched_choose(tree):
        if policy.steps < policy.probe_steps:
            fired["start-up count"] += 1
        elif policy.probe_every and policy.steps % policy.probe_every == 0:
            more = policy.steps // policy.probe_every % 2
            fired["probe count: n* and a quarter more" if more else "probe count: none"] += 1
        if policy.steps >= policy.probe_steps and policy.cost.tree_steps < policy.trusted_after:
            fired["young fit: a quarter at least"] += 1
        return watched(choose, tree)

    policy.should_draft, policy.choose = watched_should_draft, watched_choose


def main() -> None:
    fired: Counter = Counter()
    runs = replay(lambda policy: (pause_transitions(policy, fired),
                                  watch_public_calls(policy, fired)))
    mechanisms = dict(sorted(fired.items()))
    mechanisms.update(observed_mechanisms(runs))
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
