"""The benchmarked methods as vLLM speculative configs (one engine configuration each).

=================  ==============================================================
ar                 target alone (no speculative config)
dflash             chain of the drafter's argmax per depth, no correction head
ddtree             DDTree best-first tree over the drafter's per-depth marginals
domino             chain with the Domino correction head
dartree-fixed      DARTree, per-depth quotas (beta = 0)
dartree-pruned     DARTree supertree of width W pruned to the top-B by score + beta*depth
dspark             DSpark's chain: the DSpark drafter's argmax per depth, Markov-corrected
dspark-fixed       DARTree (fixed) over the DSpark drafter's Markov head
dspark-pruned      DARTree (pruned) over the DSpark drafter's Markov head
=================  ==============================================================

Chains verify one node per drafter depth (the block, not B), as DFlash/Domino do. The
``dspark*`` methods run the DSpark-format drafter (``BenchConfig.dspark_drafter``); the others
the DFlash/Domino one. Runs without a method list take the first six (``DEFAULT_METHODS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_dartree.checkpoint import DrafterLayout

DEFAULT_METHODS: tuple[str, ...] = ("ar", "dflash", "ddtree", "domino", "dartree-fixed",
                                     "dartree-pruned")
# Each DSpark method is the Domino-drafter method of the same tree on the DSpark drafter: the
# plugin takes the correction head (here the Markov head) from the checkpoint.
SAME_TREE_AS = {"dspark": "domino", "dspark-fixed": "dartree-fixed",
                "dspark-pruned": "dartree-pruned"}
DSPARK_METHODS: tuple[str, ...] = tuple(SAME_TREE_AS)
METHODS: tuple[str, ...] = DEFAULT_METHODS + DSPARK_METHODS
ALIASES = {"fixed": "dartree-fixed", "pruned": "dartree-pruned", "dartree": "dartree-pruned",
           "baseline": "ar"}
LABELS = {"ar": "AR", "dflash": "DFlash", "ddtree": "DDTree", "domino": "Domino",
          "dartree-fixed": "DARTree (fixed)", "dartree-pruned": "DARTree (pruned)",
          "dspark": "DSpark", "dspark-fixed": "DSpark + DARTree (fixed)",
          "dspark-pruned": "DSpark + DARTree (pruned)"}
TREE_METHODS = ("ddtree", "dartree-fixed", "dartree-pruned")


def config_default(key: str) -> Any:
    """The default of a dartree config key (``vllm_dartree.config`` holds them all)."""
    from vllm_dartree.config import DARTreeConfig

    return DARTreeConfig.model_fields[key].default


@dataclass(frozen=True)
class TreeParams:
    """The tree settings of a benchmark run; defaults are the plugin's (the paper's)."""

    budget: int = config_default("num_speculative_tokens")
    top_k: int = config_default("top_k")
    width: int = config_default("width")
    depth_bonus: float = config_default("depth_bonus")

    @classmethod
    def for_machine(cls, on_cpu: bool) -> TreeParams:
        """The plugin's defaults where the benchmark runs (its CPU defaults on a CPU)."""
        if not on_cpu:
            return cls()
        from vllm_dartree.config import CPU_DEFAULTS

        return cls(budget=CPU_DEFAULTS["num_speculative_tokens"], top_k=CPU_DEFAULTS["top_k"],
                   width=CPU_DEFAULTS["width"])


def canonical(name: str) -> str:
    name = ALIASES.get(name.lower(), name.lower())
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return name


def uses_dspark_drafter(method: str) -> bool:
    return canonical(method) in SAME_TREE_AS


def check_dspark_drafter(method: str, drafter: str | Path) -> None:
    """Refuse a non-DSpark checkpoint for a ``dspark*`` method (it would run another head)."""
    layout = DrafterLayout.from_dir(drafter)
    if not layout.is_dspark:
        raise ValueError(f"method {method!r} needs a DSpark drafter (a Qwen3DSparkModel "
                         f"checkpoint with a Markov head); {drafter} has head={layout.head!r}. "
                         "Pass one with --dspark-drafter")


def drafter_depths(drafter: str | Path) -> int:
    """Depths one drafter forward predicts: the block (shift layout) or block - 1."""
    return DrafterLayout.from_dir(drafter).num_depths


def speculative_config(method: str, drafter: str | Path | None, params: TreeParams,
                       depths: int | None = None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``method`` (None for AR)."""
    method = canonical(method)
    if method == "ar":
        return None
    if drafter is None:
        raise ValueError(f"method {method!r} needs a drafter checkpoint")
    if method in SAME_TREE_AS:
        check_dspark_drafter(method, drafter)
        method = SAME_TREE_AS[method]
    base: dict[str, Any] = {"method": "dartree", "model": str(drafter)}
    if method in ("dflash", "domino"):
        chain = depths or drafter_depths(drafter)
        extra = {"correction": False} if method == "dflash" else {"correction": True,
                                                                   "top_k": params.top_k}
        return base | {"tree": "chain", "num_speculative_tokens": chain} | extra
    if method == "ddtree":
        return base | {"tree": "ddtree", "num_speculative_tokens": params.budget}
    if method == "dartree-fixed":
        return base | {"tree": "fixed", "num_speculative_tokens": params.budget,
                       "top_k": params.top_k, "correction": True}
    return base | {"tree": "pruned", "num_speculative_tokens": params.budget,
                   "top_k": params.top_k, "width": min(params.width, params.budget),
                   "depth_bonus": params.depth_bonus, "correction": True}
