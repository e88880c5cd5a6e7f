"""``vllm-dartree`` console script.

- ``vllm-dartree serve MODEL [vLLM serve options]``: vLLM's OpenAI server with the plugin.
- ``vllm-dartree demo``: the main job on an embedded default (see ``vllm_dartree.demo``).
- ``vllm-dartree train-drafter --target DIR --out DIR ...``: train a DFlash drafter with a
  Domino or DSpark Markov head.
- ``vllm-dartree bench ...`` / ``vllm-dartree viz ...``: the benchmark harness and tree drawings.
"""

from __future__ import annotations

import argparse
import sys

from vllm_dartree.env import apply_process_defaults


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="vllm-dartree", description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=["serve", "demo", "train-drafter", "bench", "viz"],
        help="serve: vLLM's OpenAI server (all `vllm serve` options pass through); demo: a "
        "self-contained run on local models; train-drafter: train a Domino or DSpark "
        "(Markov) drafter for a target (`vllm-dartree train-drafter --help`); bench: "
        "methods x datasets benchmark; viz: draw verification trees",
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return
    command, rest = argv[0], argv[1:]
    parser.parse_args([command])  # validates the command name with a clear message
    apply_process_defaults()
    if command == "serve":
        from vllm_dartree.integration.launcher import run_vllm_cli

        run_vllm_cli(["serve", *rest])
    elif command == "demo":
        from vllm_dartree.demo import main as demo_main

        demo_main(rest)
    elif command == "train-drafter":
        from vllm_dartree.training.cli import main as train_main

        train_main(rest)
    elif command == "bench":
        from vllm_dartree.bench.run import main as bench_main

        bench_main(rest)
    elif command == "viz":
        from vllm_dartree.bench.viz_cli import main as viz_main

        viz_main(rest)


if __name__ == "__main__":
    main()
