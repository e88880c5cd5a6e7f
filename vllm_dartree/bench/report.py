"""``table.md``: the paper's Table 1 layout (per dataset: speedup and tau per method, plus the
average over datasets), one table per temperature, then TPOTs, the T = 0 losslessness check
and the concurrency results."""

from __future__ import annotations

from typing import Any

from vllm_dartree.bench.methods import LABELS, METHODS

DATASET_LABELS = {"gsm8k": "GSM8K", "math500": "MATH-500", "aime25": "AIME25",
                  "humaneval": "HumanEval", "mbpp": "MBPP", "mt-bench": "MT-Bench",
                  "alpaca": "Alpaca", "random": "Random ids", "average": "Avg."}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _ordered(names: set[str], order: tuple[str, ...]) -> list[str]:
    return [n for n in order if n in names] + sorted(names - set(order))


def _table(rows: list[dict[str, Any]], temperature: float, datasets: list[str],
           methods: list[str], fields: list[tuple[str, str, str, str]]) -> list[str]:
    """fields: (key, header, format spec, suffix) per dataset column."""
    index = {(r["dataset"], r["method"]): r for r in rows if r["temperature"] == temperature}
    header = ["Method"] + [f"{DATASET_LABELS.get(d, d)} {h}" for d in datasets
                           for _, h, _, _ in fields]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in methods:
        cells = [LABELS.get(method, method)]
        for dataset in datasets:
            row = index.get((dataset, method), {})
            cells += [_fmt(row.get(key), spec, suffix) for key, _, spec, suffix in fields]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(results: dict[str, Any]) -> str:
    rows = results["summary"]
    temperatures = sorted({r["temperature"] for r in rows})
    datasets = _ordered({r["dataset"] for r in rows} - {"average"},
                        tuple(DATASET_LABELS)) + ["average"]
    methods = _ordered({r["method"] for r in rows}, METHODS)
    meta = results.get("meta", {})
    out = [f"# Speculative decoding benchmark: {meta.get('target_name', '')}", "",
           _setup_line(meta), ""]
    for temp in temperatures:
        out += [f"## Temperature {temp:g}: speedup over AR and tau (macro, incl. bonus)", ""]
        out += _table(rows, temp, datasets, methods,
                      [("speedup", "Speedup", ".2f", "×"), ("tau", "τ", ".2f", "")]) + [""]
        out += [f"### Temperature {temp:g}: TPOT (ms, first token excluded)", ""]
        out += _table(rows, temp, datasets, methods, [("tpot_ms", "TPOT", ".1f", "")]) + [""]
    out += _lossless_lines(results) + [""]
    out += _concurrency_lines(results.get("concurrency") or [])
    return "\n".join(out).rstrip() + "\n"


def _setup_line(meta: dict[str, Any]) -> str:
    tree = meta.get("tree_params", {})
    return (f"Target `{meta.get('target', '?')}`, drafter `{meta.get('drafter', '?')}`; "
            f"B={tree.get('budget')}, K={tree.get('top_k')}, W={tree.get('width')}, "
            f"β={tree.get('depth_bonus')}; max_new_tokens={meta.get('max_new_tokens')}, "
            f"batch size {meta.get('batch_size')}, dtype {meta.get('dtype')}; "
            f"samples per dataset: {meta.get('num_samples')}; {_machine(meta)}.")


def _machine(meta: dict[str, Any]) -> str:
    machine = meta.get("machine") or {}
    device = machine.get("gpu") or "no GPU"
    return (f"{machine.get('cpus', '?')} x {machine.get('cpu', '?')} CPUs, {device}, "
            f"{machine.get('platform', '?')}, torch "
            f"{machine.get('torch', '?')}, vLLM {machine.get('vllm', '?')}, wall "
            f"{meta.get('wall_s', '?')} s")


def _lossless_lines(results: dict[str, Any]) -> list[str]:
    found = results.get("mismatches")
    if found is None:
        return ["Losslessness (T = 0): not checked (needs AR and T = 0 in the run)."]
    if not found:
        return ["Losslessness (T = 0): every method's output equals AR's on every sample."]
    lines = [f"Losslessness (T = 0): {len(found)} output(s) differ from AR:", "",
             "| Method | Dataset | Sample | Turn | First differing token | Length | AR length |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {m['method']} | {m['dataset']} | {m['source_index']} | {m['turn']} | "
              f"{m['first_difference']} | {m['length']} | {m['ar_length']} |" for m in found]
    return lines


def _concurrency_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    levels = sorted({r["concurrency"] for r in rows})
    methods = _ordered({r["method"] for r in rows}, METHODS)
    index = {(r["method"], r["concurrency"]): r for r in rows}
    header = ["Method"] + [f"C={c} tok/s (speedup)" for c in levels]
    lines = ["## Concurrency: aggregate completion tokens/s (OpenAI server, loopback)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in methods:
        cells = [LABELS.get(method, method)]
        for level in levels:
            row = index.get((method, level), {})
            cells.append(f"{_fmt(row.get('tokens_per_s'), '.1f')} "
                         f"({_fmt(row.get('speedup'), '.2f', '×')})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]
