"""Drawings of verification trees with the accepted path highlighted (paper Figures 8-11).

The command line (``vllm-dartree viz``) is :mod:`vllm_dartree.bench.viz_cli`. Depth grows to the right; the root is the last committed token; accepted nodes and
edges are red, the rest grey, and the target's bonus token after the path is a dashed box.
Labels are token texts when the target has a tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm_dartree.bench.methods import label as method_label
from vllm_dartree.bench.plots import pyplot

ACCEPTED = "#d62728"
OTHER = "#9e9e9e"


def children_of(tree: dict[str, Any]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {0: []}
    for column, (parent, ok) in enumerate(zip(tree["parents"], tree["valid"])):
        if ok:
            kids.setdefault(parent, []).append(column + 1)
            kids.setdefault(column + 1, [])
    return kids


def layout(tree: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """(x = depth, y) per node: leaves on consecutive rows in DFS order, parents centred."""
    kids = children_of(tree)
    pos: dict[int, tuple[float, float]] = {}
    next_row = [0.0]

    def place(node: int, depth: int) -> float:
        if not kids[node]:
            y = next_row[0]
            next_row[0] += 1
        else:
            ys = [place(child, depth + 1) for child in kids[node]]
            y = (min(ys) + max(ys)) / 2
        pos[node] = (float(depth), y)
        return y

    place(0, 0)
    return pos


def label(tree: dict[str, Any], node: int | str, width: int = 10) -> str:
    """Token text (or id) of a node; node 0 is the root, "bonus" the bonus token."""
    texts = tree.get("token_text")
    if node in (0, "bonus"):
        key = "root" if node == 0 else "bonus"
        text = tree.get(f"{key}_text")
        text = text if text is not None else str(tree.get(key, key))
    else:
        text = texts[node - 1] if texts else str(tree["tokens"][node - 1])
    return short(text, width)


def short(text: str, width: int) -> str:
    text = text.replace("\n", "⏎").replace("\t", "⇥").replace("$", r"\$")
    return text if len(text) <= width else text[: width - 1] + "…"


def draw_tree(tree: dict[str, Any], title: str, path: Path) -> Path:
    plt = pyplot()
    pos = layout(tree)
    on_path = set(tree.get("accepted", [0]))
    rows = max(y for _, y in pos.values()) + 1
    depth = max(max(x for x, _ in pos.values()), len(on_path)) + 1
    fig, ax = plt.subplots(figsize=(1.5 + 0.95 * depth, max(2.2, 0.9 + 0.28 * rows)))
    _draw_bonus(ax, tree, pos)
    for node, kids in children_of(tree).items():
        for child in kids:
            hot = node in on_path and child in on_path
            (x0, y0), (x1, y1) = pos[node], pos[child]
            ax.plot([x0, x1], [y0, y1], color=ACCEPTED if hot else OTHER,
                    lw=2.2 if hot else 0.8, zorder=1)
    for node, (x, y) in pos.items():
        hot = node in on_path
        ax.text(x, y, label(tree, node), ha="center", va="center", fontsize=7, zorder=2,
                color="white" if hot else "black",
                bbox={"boxstyle": "round,pad=0.2", "fc": ACCEPTED if hot else "#f2f2f2",
                      "ec": ACCEPTED if hot else OTHER, "lw": 0.6})
    ax.set_xlim(-0.6, depth - 0.4)
    ax.set_ylim(rows, -0.5)  # room below the last row for a bonus box
    ax.set_xticks(range(int(depth)))
    ax.set_xlabel("depth")
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    nodes = sum(tree["valid"])
    ax.set_title(f"{title}\n{nodes} nodes, accepted length {len(on_path)} (incl. bonus)",
                 fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _draw_bonus(ax: Any, tree: dict[str, Any], pos: dict[int, tuple[float, float]]) -> None:
    """The target's token after the accepted path: a dashed box one depth further."""
    path = tree.get("accepted", [0])
    if tree.get("bonus") is None or not path:
        return
    x, y = pos[path[-1]]
    x_bonus, y_bonus = x + 0.5, y + 0.5  # between columns and rows: not a tree node
    ax.plot([x, x_bonus], [y, y_bonus], color=ACCEPTED, lw=1.4, ls="--", zorder=1)
    ax.text(x_bonus, y_bonus, label(tree, "bonus"), ha="center", va="center", fontsize=7, zorder=2,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": ACCEPTED, "ls": "--"})


def kept_trees(run: dict[str, Any]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(turn, round index, tree) for every tree kept in a run."""
    for t, turn in enumerate(run["turns"]):
        for tree in turn.get("trees", []):
            yield t, tree["round"], tree


def draw_runs(runs: list[dict[str, Any]], out: Path, rounds: list[int] | None = None,
              limit: int = 3) -> list[Path]:
    """Draw kept trees: the given round indices, else the first ``limit`` per run."""
    written = []
    for run in runs:
        found = list(kept_trees(run))
        chosen = [f for f in found if f[1] in rounds] if rounds is not None else found[:limit]
        for turn, k, tree in chosen:
            name = (f"tree_{run['method']}_{run['dataset']}{run['source_index']}"
                    f"_T{float(run['temperature']):g}_turn{turn}_round{k}.png")
            title = (f"{method_label(run['method'])} · {run['dataset']} "
                     f"#{run['source_index']} · turn {turn} · round {k}")
            written.append(draw_tree(tree, title, out / name))
    return written


def select_runs(results: dict[str, Any], methods: list[str] | None, dataset: str | None,
                sample: int | None, temperature: float | None) -> list[dict[str, Any]]:
    def keep(run: dict[str, Any]) -> bool:
        return ((methods is None or run["method"] in methods)
                and (dataset is None or run["dataset"] == dataset)
                and (sample is None or run["source_index"] == sample)
                and (temperature is None or float(run["temperature"]) == temperature)
                and any(True for _ in kept_trees(run)))

    return [r for r in results["runs"] if keep(r)]
