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
dartree-adaptive   DARTree (pruned) of B nodes per request at most, verified as far as the
                   adaptive verification finds it pays (``budget_policy: adaptive``)
lattice            vLLM's own speculator for a DFlash2/LiLiCorr drafter: its greedy walk
                   through the drafter's candidate lattice (vLLM's method "dflash")
lattice-chain      dartree's chain over the same lattice (the same drafts as ``lattice``)
lattice-ddtree     DDTree over the lattice drafter's candidate logits
lattice-fixed      DARTree (fixed) over the lattice
lattice-pruned     DARTree (pruned) over the lattice
=================  ==============================================================

A tree method may carry its own B and W after a colon, e.g. ``dartree-pruned:b64w12`` or
``dartree-adaptive:b64``, so one run can compare several sizes (the run's ``--budget`` and
``--width`` apply otherwise); ``dartree-adaptive:wauto`` lets the policy choose the width
(``width: "auto"``).

Chains verify one node per drafter depth (the block, not B), as DFlash/Domino do. The
``dspark*`` methods run the DSpark-format drafter (``BenchConfig.dspark_drafter``); the others
the DFlash/Domino one. The ``lattice*`` methods need a lattice drafter (DFlash2, LiLiCorr) as
``--drafter`` and vLLM's V2 runner (``--runner v2``: vLLM runs these drafters nowhere else);
K is the checkpoint's. Runs without a method list take the first six (``DEFAULT_METHODS``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
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
# Each lattice method but vLLM's own is the Domino-drafter method of the same tree, run on a
# lattice drafter (whose lattice is its correction).
LATTICE_SAME_TREE_AS = {"lattice-chain": "domino", "lattice-ddtree": "ddtree",
                        "lattice-fixed": "dartree-fixed", "lattice-pruned": "dartree-pruned"}
LATTICE_METHODS: tuple[str, ...] = ("lattice", *LATTICE_SAME_TREE_AS)
METHODS: tuple[str, ...] = (DEFAULT_METHODS + DSPARK_METHODS + ("dartree-adaptive",)
                            + LATTICE_METHODS)
ALIASES = {"fixed": "dartree-fixed", "pruned": "dartree-pruned", "dartree": "dartree-pruned",
           "baseline": "ar", "adaptive": "dartree-adaptive"}
LABELS = {"ar": "AR", "dflash": "DFlash", "ddtree": "DDTree", "domino": "Domino",
          "dartree-fixed": "DARTree (fixed)", "dartree-pruned": "DARTree (pruned)",
          "dspark": "DSpark", "dspark-fixed": "DSpark + DARTree (fixed)",
          "dspark-pruned": "DSpark + DARTree (pruned)", "dartree-adaptive": "DARTree (adaptive)",
          "lattice": "vLLM lattice walk", "lattice-chain": "Lattice chain (dartree)",
          "lattice-ddtree": "Lattice + DDTree", "lattice-fixed": "Lattice + DARTree (fixed)",
          "lattice-pruned": "Lattice + DARTree (pruned)"}
TREE_METHODS = ("ddtree", "dartree-fixed", "dartree-pruned")
SIZED_METHODS = ("ddtree", "dartree-fixed", "dartree-pruned", "dartree-adaptive", "dspark-fixed",
                 "dspark-pruned", "lattice-ddtree", "lattice-fixed", "lattice-pruned")
SIZED = re.compile(r"^(?:b(?P<budget>\d+))?(?:w(?P<width>\d+|auto))?$")


def config_default(key: str) -> Any:
    """The default of a dartree config key (``vllm_dartree.config`` holds them all)."""
    from vllm_dartree.config import DARTreeConfig

    return DARTreeConfig.model_fields[key].default


@dataclass(frozen=True)
class TreeParams:
    """The tree settings of a benchmark run; defaults are the plugin's (the paper's)."""

    budget: int = config_default("num_speculative_tokens")
    top_k: int = config_default("top_k")
    width: int | str = config_default("width")  # or "auto" (adaptive verification only)
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
    """The method's name as results record it (aliases resolved, a size suffix checked)."""
    base, _, size = name.lower().partition(":")
    base = ALIASES.get(base, base)
    if base not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    if size:
        sized = SIZED.match(size)
        if base not in SIZED_METHODS or not sized:
            raise ValueError(f"method {name!r}: a size suffix is 'bB', 'wW' or 'bBwW' (e.g. "
                             f"'dartree-pruned:b64w12') on a tree method")
        if sized["width"] == "auto" and base != "dartree-adaptive":
            raise ValueError(f"method {name!r}: 'wauto' (width chosen by adaptive verification) "
                             "applies to dartree-adaptive only")
        return f"{base}:{size}"
    return base


def base_method(method: str) -> str:
    """The method without its size suffix."""
    return canonical(method).partition(":")[0]


def sized_params(method: str, params: TreeParams) -> TreeParams:
    """``params`` with the method's own B and W (from its suffix) where it has them."""
    size = canonical(method).partition(":")[2]
    if not size:
        return params
    sized = SIZED.match(size)
    changes = {k: v if v == "auto" else int(v) for k, v in sized.groupdict().items()
               if v is not None}
    return replace(params, **changes)


def label(method: str) -> str:
    """A method's name in tables and figures."""
    base, _, size = canonical(method).partition(":")
    text = LABELS.get(base, base)
    if size:
        sized = SIZED.match(size).groupdict()
        text += " " + " ".join(f"{k[0].upper()}={v}" for k, v in sized.items() if v)
    return text


def uses_dspark_drafter(method: str) -> bool:
    return base_method(method) in SAME_TREE_AS


def check_dspark_drafter(method: str, drafter: str | Path) -> None:
    """Refuse a non-DSpark checkpoint for a ``dspark*`` method (it would run another head)."""
    layout = DrafterLayout.from_dir(drafter)
    if not layout.is_dspark:
        raise ValueError(f"method {method!r} needs a DSpark drafter (a Qwen3DSparkModel "
                         f"checkpoint with a Markov head); {drafter} has head={layout.head!r}. "
                         "Pass one with --dspark-drafter")


def check_lattice_drafter(method: str, drafter: str | Path) -> None:
    """Refuse a drafter without a candidate lattice for a ``lattice*`` method."""
    if not DrafterLayout.from_dir(drafter).has_lattice:
        raise ValueError(f"method {method!r} needs a lattice drafter (a DFlash2DraftModel or "
                         f"LiLiCorrDraftModel checkpoint); {drafter} has none")


def drafter_depths(drafter: str | Path) -> int:
    """Depths one drafter forward predicts: the block (shift layout) or block - 1."""
    return DrafterLayout.from_dir(drafter).num_depths


def speculative_config(method: str, drafter: str | Path | None, params: TreeParams,
                       depths: int | None = None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``method`` (None for AR)."""
    params = sized_params(method, params)
    method = base_method(method)
    if method == "ar":
        return None
    if drafter is None:
        raise ValueError(f"method {method!r} needs a drafter checkpoint")
    if method in SAME_TREE_AS:
        check_dspark_drafter(method, drafter)
        method = SAME_TREE_AS[method]
    if method == "lattice":  # vLLM's own speculator: one walk over the block's depths
        check_lattice_drafter(method, drafter)
        return {"method": "dflash", "model": str(drafter),
                "num_speculative_tokens": depths or drafter_depths(drafter)}
    if method in LATTICE_SAME_TREE_AS:
        check_lattice_drafter(method, drafter)
        method = LATTICE_SAME_TREE_AS[method]
    spec = _dartree_config(method, drafter, params, depths)
    if DrafterLayout.from_dir(drafter).has_lattice:
        spec.pop("top_k", None)  # K is the lattice's own
    return spec


def _dartree_config(method: str, drafter: str | Path, params: TreeParams,
                    depths: int | None) -> dict[str, Any]:
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
    pruned = base | {"tree": "pruned", "num_speculative_tokens": params.budget,
                     "top_k": params.top_k,
                     "width": params.width if params.width == "auto" else min(params.width,
                                                                              params.budget),
                     "depth_bonus": params.depth_bonus, "correction": True}
    if method == "dartree-adaptive":
        return pruned | {"budget_policy": "adaptive"}
    return pruned
