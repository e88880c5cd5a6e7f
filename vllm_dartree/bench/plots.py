"""PNG figures from ``results.json`` runs (matplotlib, Agg backend).

- ``acceptance_t{T}.png`` (paper Figure 5): position-wise acceptance Pr(L >= t) per method,
  one panel per dataset plus all datasets together (rounds pooled).
- ``depths_t{T}.png`` (paper Figure 7): node-depth distribution of the verification trees,
  mean nodes per tree at each depth, per method, all datasets pooled and per dataset.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vllm_dartree.bench import metrics
from vllm_dartree.bench.methods import METHODS, label
from vllm_dartree.bench.report import DATASET_LABELS

Run = dict[str, Any]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    datasets = sorted({r["dataset"] for r in runs}, key=lambda d: list(DATASET_LABELS).index(d)
                      if d in DATASET_LABELS else len(DATASET_LABELS))
    panels = [(DATASET_LABELS.get(d, d), [r for r in runs if r["dataset"] == d])
              for d in datasets]
    return panels if len(panels) == 1 else [("all datasets", runs)] + panels


def _methods(runs: list[Run], exclude: tuple[str, ...] = ()) -> list[str]:
    present = {r["method"] for r in runs}
    return [m for m in METHODS if m in present and m not in exclude]


def _grid(plt, count: int, title: str):
    cols = min(4, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    fig.suptitle(title)
    from matplotlib.ticker import MaxNLocator

    for ax in axes.flat[count:]:
        ax.set_visible(False)
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, list(axes.flat)


def acceptance_figure(runs: list[Run], temperature: float, path: Path) -> Path | None:
    methods = _methods(runs, exclude=("ar",))
    if not methods:
        return None
    plt = pyplot()
    panels = _panels(runs)
    fig, axes = _grid(plt, len(panels), f"Position-wise acceptance Pr(L ≥ t), T = {temperature:g}")
    for ax, (name, members) in zip(axes, panels):
        for method in methods:
            lengths = [n for r in members if r["method"] == method
                       for n in metrics.acceptance_lengths(r)]
            curve = metrics.survival(lengths)
            if curve:
                ax.plot(range(1, len(curve) + 1), curve, marker="o", ms=3,
                        label=label(method))
        ax.set(title=name, xlabel="t (accepted length incl. bonus)", ylabel="Pr(L ≥ t)",
               ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(plt, fig, path)


def depth_figure(runs: list[Run], temperature: float, path: Path) -> Path | None:
    methods = [m for m in _methods(runs, exclude=("ar",))
               if metrics.depth_profile([r for r in runs if r["method"] == m])]
    if not methods:
        return None
    plt = pyplot()
    panels = _panels(runs)
    fig, axes = _grid(plt, len(panels), f"Verification-tree nodes per depth, T = {temperature:g}")
    width = 0.8 / len(methods)
    for ax, (name, members) in zip(axes, panels):
        for i, method in enumerate(methods):
            profile = metrics.depth_profile([r for r in members if r["method"] == method])
            xs = [d + 1 + (i - (len(methods) - 1) / 2) * width for d in range(len(profile))]
            ax.bar(xs, profile, width=width, label=label(method))
        ax.set(title=name, xlabel="node depth", ylabel="mean nodes per tree")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def concurrency_figure(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Speedup over AR against concurrency, one line per method, one panel per dataset."""
    rows = [r for r in rows if r.get("speedup") is not None]
    if not rows:
        return None
    plt = pyplot()
    datasets = sorted({r.get("dataset", "all") for r in rows})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        members = [r for r in rows if r.get("dataset", "all") == dataset]
        for method in [m for m in METHODS if any(r["method"] == m for r in members)] + sorted(
                {r["method"] for r in members} - set(METHODS)):
            points = sorted((r["concurrency"], r["speedup"]) for r in members
                            if r["method"] == method)
            ax.plot(*zip(*points), marker="o", label=label(method))
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set(title=DATASET_LABELS.get(dataset, dataset), xlabel="concurrent requests",
               ylabel="tokens/s over AR")
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def write_figures(runs: list[Run], out: Path,
                  concurrency: list[dict[str, Any]] | None = None) -> list[Path]:
    written = []
    if concurrency:
        path = concurrency_figure(concurrency, out / "concurrency.png")
        if path is not None:
            written.append(path)
    for temp in sorted({float(r["temperature"]) for r in runs}):
        members = [r for r in runs if float(r["temperature"]) == temp]
        tag = f"{temp:g}".replace(".", "p")
        for make, name in ((acceptance_figure, "acceptance"), (depth_figure, "depths")):
            path = make(members, temp, out / f"{name}_t{tag}.png")
            if path is not None:
                written.append(path)
    return written
