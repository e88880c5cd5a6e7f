"""Batch-1 speed measured in interleaved rounds: one `vllm-dartree bench` process per setting,
the settings in turn, repeated; speedup = AR's TPOT over the setting's TPOT within a round.

On a shared machine whose speed drifts by more than the effect within minutes, a single
bench run (its methods measured one after another) does not tell a 10% change apart; the
ratio within a round, whose processes run back to back, does. Medians over rounds.

    python benchmarks/interleaved_pairs.py --rounds 4 \\
        --setting ar "--methods ar" \\
        --setting pruned "--methods dartree-pruned" \\
        --setting pruned-v16k "--methods dartree-pruned --drafter DIR"

The first setting is the reference (normally AR). Each round's results.json is kept under
``--out``; the table is printed and written to ``--out/pairs.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

COMMON = ("--datasets gsm8k math500 --num-samples 2 --max-new-tokens 256 --dtype float32 "
          "--threads 2")


def run_setting(args: str, common: str, out: Path) -> dict[str, tuple[float, float]]:
    """{dataset: (TPOT ms, tau)} of one bench process with ``common`` and ``args`` (leading
    NAME=VALUE words of ``args`` are environment variables of that process)."""
    words = shlex.split(args)
    env = dict(os.environ)
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    cmd = [sys.executable, "-m", "vllm_dartree.cli", "bench", *shlex.split(common), *words,
           "--out", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    summary = json.loads((out / "results.json").read_text())["summary"]
    return {row["dataset"]: (row["tpot_ms"], row["tau"]) for row in summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--setting", nargs=2, action="append", metavar=("NAME", "ARGS"),
                   required=True, help="a name and its bench arguments; the first is the "
                   "reference")
    p.add_argument("--common", default=COMMON, help=f"arguments of every run ({COMMON})")
    p.add_argument("--out", default=".cache/pairs")
    args = p.parse_args()
    out = Path(args.out)
    names = [name for name, _ in args.setting]
    tpot: dict[str, list[dict[str, tuple[float, float]]]] = {n: [] for n in names}
    for round_index in range(args.rounds):
        for name, extra in args.setting:
            result = run_setting(extra, args.common, out / f"round{round_index}" / name)
            tpot[name].append(result)
            print(f"round {round_index} {name}: " + ", ".join(
                f"{d} {ms:.1f} ms (tau {tau:.2f})" for d, (ms, tau) in result.items()),
                flush=True)
    reference = names[0]
    datasets = list(tpot[reference][0])
    lines = ["| setting | dataset | " + " | ".join(f"round {i + 1}" for i in range(args.rounds))
             + " | median speedup | median TPOT ms | tau |",
             "|---|---|" + "---|" * (args.rounds + 3)]
    for name in names:
        for dataset in datasets:
            ratios = [tpot[reference][i][dataset][0] / tpot[name][i][dataset][0]
                      for i in range(args.rounds)]
            ms = [tpot[name][i][dataset][0] for i in range(args.rounds)]
            tau = [tpot[name][i][dataset][1] for i in range(args.rounds)]
            lines.append(f"| {name} | {dataset} | " + " | ".join(f"{r:.2f}x" for r in ratios)
                         + f" | **{statistics.median(ratios):.2f}x** | "
                         f"{statistics.median(ms):.1f} | {statistics.median(tau):.2f} |")
    table = "\n".join(lines)
    (out / "pairs.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
