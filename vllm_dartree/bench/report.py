"""``table.md``: the paper's Table 1 layout (per dataset: speedup and tau per method, plus the
average over datasets), one table per temperature, then TPOTs, the T = 0 losslessness check
and the concurrency results."""

from __future__ import annotations

from typing import Any

from vllm_dartree.bench.methods import METHODS, label, uses_dspark_drafter
from vllm_dartree.bench.serving import CONTENDER_SHARE

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
        cells = [label(method)]
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
    if meta.get("speed_note"):
        out += [f"**Note: {meta['speed_note']}.**", ""]
    for temp in temperatures:
        out += [f"## Temperature {temp:g}: speedup over AR and tau (macro, incl. bonus)", ""]
        out += _table(rows, temp, datasets, methods,
                      [("speedup", "Speedup", ".2f", "×"), ("tau", "τ", ".2f", "")]) + [""]
        out += [f"### Temperature {temp:g}: TPOT (ms, first token excluded)", ""]
        out += _table(rows, temp, datasets, methods, [("tpot_ms", "TPOT", ".1f", "")]) + [""]
    out += _profile_lines(results) + _lossless_lines(results) + [""]
    out += _concurrency_lines(results.get("concurrency") or [])
    return "\n".join(out).rstrip() + "\n"


def _setup_line(meta: dict[str, Any]) -> str:
    tree = meta.get("tree_params", {})
    return (f"Target `{meta.get('target', '?')}`, {_drafters(meta)}; "
            f"B={tree.get('budget')}, K={tree.get('top_k')}, W={tree.get('width')}, "
            f"β={tree.get('depth_bonus')}; max_new_tokens={meta.get('max_new_tokens')}, "
            f"batch size {meta.get('batch_size')}, dtype {meta.get('dtype')}; "
            f"samples per dataset: {meta.get('num_samples')}; {_machine(meta)}.")


def _drafters(meta: dict[str, Any]) -> str:
    """The drafter checkpoints the run's methods used (the dspark* methods have their own)."""
    methods = meta.get("methods") or []
    dspark = [m for m in methods if uses_dspark_drafter(m)]
    named = []
    if not methods or len(dspark) < len([m for m in methods if m != "ar"]):
        named.append(f"drafter `{meta.get('drafter', '?')}`")
    if dspark:
        named.append(f"DSpark drafter `{meta.get('dspark_drafter', '?')}`")
    return ", ".join(named) or "no drafter"


def _machine(meta: dict[str, Any]) -> str:
    machine = meta.get("machine") or {}
    device = machine.get("gpu") or "no GPU"
    isa = f" ({machine['cpu_capability']})" if machine.get("cpu_capability") else ""
    return (f"{machine.get('cpus', '?')} x {machine.get('cpu', '?')} CPUs{isa}, {device}, "
            f"{machine.get('platform', '?')}, torch "
            f"{machine.get('torch', '?')}, vLLM {machine.get('vllm', '?')}, wall "
            f"{meta.get('wall_s', '?')} s"
            + (f", vLLM's {meta['runner_used'].upper()} model runner"
               if meta.get("runner_used") else ""))


def _lossless_lines(results: dict[str, Any]) -> list[str]:
    found = results.get("mismatches")
    if found is None and not results.get("runs"):
        return []  # a serving-only run: its concurrency section checks the served outputs
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


def _checked(row: dict[str, Any]) -> int:
    """Completions of ``row`` compared with AR's first round. Results written before rows
    carried ``checked`` compared every request of a non-AR method and none of AR's."""
    return row.get("checked", row["requests"] * (row["method"] != "ar"))


def _concurrency_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The paper's Table 4 per dataset: tokens/s and speedup over AR at each concurrency."""
    if not rows:
        return []
    levels = sorted({r["concurrency"] for r in rows})
    methods = _ordered({r["method"] for r in rows}, METHODS)
    datasets = _ordered({r.get("dataset", "all") for r in rows}, tuple(DATASET_LABELS))
    index = {(r["method"], r.get("dataset", "all"), r["concurrency"]): r for r in rows}
    header = ["Method"] + [f"C={c} tok/s (speedup)" for c in levels]
    lines = ["## Concurrency: aggregate completion tokens/s (OpenAI server, loopback)", ""]
    for dataset in datasets:
        lines += [f"### {DATASET_LABELS.get(dataset, dataset)}", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for method in methods:
            cells = [label(method)]
            for level in levels:
                row = index.get((method, dataset, level), {})
                cells.append(f"{_fmt(row.get('tokens_per_s'), '.1f')} "
                             f"({_fmt(row.get('speedup'), '.2f', '×')})"
                             + ("†" if row.get("cut") else ""))
            lines.append("| " + " | ".join(cells) + " |")
        sizes = [m for m in methods if m.startswith("dartree-adaptive")]
        for method in sizes:
            chosen = [f"C={c}: {index[(method, dataset, c)]['drafts_per_step']:.1f}"
                      for c in levels if (method, dataset, c) in index]
            lines += ["", f"{label(method)}: draft nodes verified per request-step "
                      f"({', '.join(chosen)})."]
            shares = [f"C={c}: {index[(method, dataset, c)]['drafted_share']:.0%}"
                      for c in levels if "drafted_share" in index.get((method, dataset, c), {})]
            if shares:
                lines.append(f"Share of request-steps that verified a draft ({', '.join(shares)}).")
            widths = [f"C={c}: {index[(method, dataset, c)]['mean_width']:.1f}"
                      for c in levels if index.get((method, dataset, c), {}).get("mean_width")]
            if widths:
                lines.append(f"Mean tree width per drafted step ({', '.join(widths)}).")
        lines.append("")
    cut = [r for r in rows if r.get("cut")]
    if cut:
        lines += ["† Cut short: the round stopped sending requests once it could no longer "
                  f"reach {CONTENDER_SHARE:.0%} of the best rate measured before it in the "
                  "cell; the rate is over the requests it completed (" + ", ".join(
                      f"{DATASET_LABELS.get(r.get('dataset', 'all'), r.get('dataset'))} "
                      f"C={r['concurrency']} {label(r['method'])}: {r['requests']}"
                      for r in cut) + ").", ""]
    repeated = [r for r in rows if len(r.get("rounds_tokens_per_s", [])) > 1]
    if repeated:
        rounds = max(len(r["rounds_tokens_per_s"]) for r in repeated)
        lines += [f"Median of {rounds} interleaved rounds per method and cell; a method under "
                  f"{CONTENDER_SHARE:.0%} of a cell's best rate in the first round was measured "
                  "once there. Every round's tok/s:", ""]
        for r in repeated:
            rates = ", ".join(f"{x:.1f}" for x in r["rounds_tokens_per_s"])
            lines.append(f"- {DATASET_LABELS.get(r.get('dataset', 'all'), r.get('dataset'))} "
                         f"C={r['concurrency']} {label(r['method'])}: {rates}")
        lines.append("")
    checked = [r for r in rows if r.get("mismatches") is not None and _checked(r)]
    differ = sum(r["mismatches"] for r in checked)
    if checked:
        total = sum(_checked(r) for r in checked)
        lines.append(f"Losslessness (T = 0): {differ} of {total} served completions differ "
                     "from AR's (first round).")
    return lines + [""]


PHASE_LABELS = {"drafter_forward": "drafter forward", "drafter_logits": "drafter logits",
                "tree_build": "tree build", "target_forward": "target forward",
                "stock_attention": "  stock attention", "tree_attention": "  tree attention",
                "target_rest": "  rest of the forward", "target_logits": "target logits",
                "accept": "sampling + acceptance",
                "kv_compaction": "KV compaction", "host": "host / other",
                "round": "round (total)"}


def profile_rows(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Median ms per phase per method over every profiled round (all datasets, T)."""
    from vllm_dartree.step.profile import summarize

    by_method: dict[str, list[dict[str, float]]] = {}
    for block in results.get("profile") or []:
        by_method.setdefault(block["method"], []).extend(block["rounds"])
    table = {}
    for method, rounds in by_method.items():
        medians = summarize(rounds)
        medians["target_rest"] = max(0.0, medians["target_forward"] - medians["stock_attention"]
                                     - medians["tree_attention"])
        counted = ("drafter_forward", "drafter_logits", "tree_build", "target_forward",
                   "target_logits", "accept", "kv_compaction")
        medians["host"] = max(0.0, medians["round"] - sum(medians[k] for k in counted))
        medians["rounds"] = len(rounds)
        table[method] = medians
    return table


def _profile_lines(results: dict[str, Any]) -> list[str]:
    table = profile_rows(results)
    if not table:
        return []
    methods = _ordered(set(table), METHODS)
    ar = [r["tpot_ms"] for r in results["summary"] if r["method"] == "ar"
          and r["dataset"] == "average" and r.get("tpot_ms")]
    header = ["Phase"] + [f"{label(m)} ms (share)" for m in methods]
    lines = ["## Where a round's time goes (median ms, share of the round)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for phase, phase_label in PHASE_LABELS.items():
        cells = [phase_label]
        for method in methods:
            row = table[method]
            share = row[phase] / row["round"] if row["round"] else 0.0
            cells.append(f"{row[phase]:.1f} ({share:.0%})")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| rounds | " + " | ".join(str(table[m]["rounds"]) for m in methods) + " |")
    if ar:
        lines += ["", f"AR step in the same run (TPOT, mean over datasets): {ar[0]:.1f} ms."]
    return lines + [""]
