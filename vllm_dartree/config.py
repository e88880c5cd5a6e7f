"""The one configuration model of vllm-dartree and the single source of its defaults.

Users pass it as vLLM's speculative config::

    {"method": "dartree", "model": DRAFTER, "num_speculative_tokens": 64,
     "tree": "pruned", "width": 12, "top_k": 64, "depth_bonus": -0.2, "correction": true,
     "budget_policy": "fixed"}

``budget_policy: "adaptive"`` makes ``num_speculative_tokens`` an upper bound per request:
each step verifies only the nodes a cost model says pay for themselves, down to none
(``vllm_dartree.tree.adaptive``). It needs vLLM's synchronous scheduler (variable draft
counts per request); an engine left to choose gets it, ``async_scheduling=True`` is refused.
With it, ``width: "auto"`` lets the policy narrow the pruned tree each step to the nodes its
requests were given (``tree.adaptive.AutoWidth``), up to the width that would apply otherwise.

Validation runs before any model is loaded. Every error names the key, the value given and
what is allowed. Settings that need the drafter checkpoint (vocabulary size, whether it has
a correction head) are checked again when the drafter's config is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from vllm_dartree.checkpoint import DrafterLayout

TreeVariant = Literal["pruned", "fixed", "ddtree", "chain"]
BudgetPolicy = Literal["fixed", "adaptive"]

# vLLM's own speculative keys that keep their vLLM meaning under dartree.
VLLM_PASSTHROUGH_KEYS = frozenset(
    {
        "draft_tensor_parallel_size",
        "quantization",
        "revision",
        "code_revision",
        "max_model_len",
        "enforce_eager",
        "disable_padded_drafter_batch",
    }
)

# The V1 rejection-sampler contract caps a step at 128 draft slots, and the verify
# rows are root + B; 127 keeps every buffer inside that contract.
MAX_BUDGET = 127
# Which variant reads which dartree-only knob; a knob given to a variant that ignores it
# is an error, because nothing is silently ignored.
KNOBS_BY_VARIANT: dict[str, frozenset[str]] = {
    "pruned": frozenset({"width", "top_k", "depth_bonus", "correction"}),
    "fixed": frozenset({"top_k", "depth_bonus", "correction"}),
    "chain": frozenset({"top_k", "correction"}),
    "ddtree": frozenset(),
}


# Defaults on CPUs, where every verified row costs real compute (a SmolLM2-135M verify row
# about 2 ms against a 25-40 ms decode step): small trees win. B and W chosen by
# ``benchmarks/sweep_cpu_defaults.py`` on GSM8K/MATH training-split prompts (table in
# ``benchmarks/results/cpu-sweep/``); the paper's defaults below stay for GPUs. K is wide
# because it is nearly free and tau is not: the candidates' log-probs are normalised over
# the K, so a short list overrates every candidate and the head picks among fewer. At
# B = 6, W = 4 (same prompts, tau being deterministic at T = 0): K = 16 -> 128 raised tau
# 2.44 -> 2.61 (GSM8K train) and 2.04 -> 2.14 (MATH train) at the same tree-build time;
# K = 256 added under 1% for 0.8 ms more (``cpu-sweep/top-k-tau.md``).
CPU_DEFAULTS: dict[str, Any] = {"num_speculative_tokens": 6, "width": 4, "top_k": 128}


class DARTreeConfigError(ValueError):
    """A dartree speculative config that cannot run; the message says what to change."""


class DARTreeConfig(BaseModel):
    """Validated dartree settings. Defaults follow the paper (K=64, W=12, B=64, beta=-0.2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["dartree"] = "dartree"
    model: str
    # B: draft nodes per tree, the number the gate hands vLLM as its num_speculative_tokens
    # (once); with the adaptive policy the most a request verifies in a step.
    num_speculative_tokens: int = 64
    tree: TreeVariant = "pruned"
    width: int | Literal["auto"] = 12
    top_k: int = 64
    depth_bonus: float = -0.2
    correction: bool | None = None
    # The user-facing key keeps its name (and the metrics their ``vllm_dartree:budget_*``
    # names): "adaptive" is the policy the code calls adaptive verification (tree/adaptive/).
    budget_policy: BudgetPolicy = "fixed"
    vllm_options: dict[str, Any] = {}
    _machine_defaults: frozenset[str] = PrivateAttr(default=frozenset())
    _cpu_width: int | None = PrivateAttr(default=None)  # CPU default width, parsed on a CPU

    def user_set(self, key: str) -> bool:
        """Whether the user chose ``key`` (not a default, machine defaults included)."""
        return key in self.model_fields_set and key not in self._machine_defaults

    @property
    def adaptive(self) -> bool:
        return self.budget_policy == "adaptive"

    @field_validator("model")
    @classmethod
    def _model_given(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a drafter checkpoint directory or hub id")
        return value

    @field_validator("num_speculative_tokens")
    @classmethod
    def _budget_range(cls, value: int) -> int:
        if not 1 <= value <= MAX_BUDGET:
            raise ValueError(f"must be between 1 and {MAX_BUDGET} (the verify budget B)")
        return value

    @property
    def auto_width(self) -> bool:
        return self.width == "auto"

    @property
    def max_width(self) -> int:
        """The pruned tree's widest W: ``width``, or with ``"auto"`` the width that would
        apply without it (12, or the CPU default on a CPU), capped at the budget."""
        if not self.auto_width:
            return self.width
        default = self._cpu_width or type(self).model_fields["width"].default
        return min(default, self.num_speculative_tokens)

    @field_validator("width", "top_k")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if value != "auto" and value < 1:
            raise ValueError("must be >= 1")
        return value

    @model_validator(mode="after")
    def _variant_rules(self) -> DARTreeConfig:
        given = self.model_fields_set
        used = KNOBS_BY_VARIANT[self.tree]
        for knob in ("width", "top_k", "depth_bonus", "correction"):
            if knob in given and knob not in used:
                raise ValueError(
                    f"'{knob}' does not apply to tree '{self.tree}' "
                    f"(it applies to: {', '.join(v for v, k in KNOBS_BY_VARIANT.items() if knob in k)})"
                )
        if self.tree == "pruned" and self.depth_bonus > 0:
            raise ValueError(
                f"'depth_bonus' = {self.depth_bonus} is not allowed for tree 'pruned': it must be "
                "<= 0, which keeps the pruned tree prefix-closed"
            )
        if self.tree == "fixed" and "depth_bonus" in given and self.depth_bonus != 0:
            raise ValueError(
                f"'depth_bonus' = {self.depth_bonus} is not allowed for tree 'fixed': it must be 0 "
                "(per-depth quotas already decide the depth profile)"
            )
        if self.auto_width and self.budget_policy != "adaptive":
            raise ValueError(
                "'width' = 'auto' needs 'budget_policy' = 'adaptive' (the width follows the "
                "nodes adaptive verification gives each request); with 'budget_policy' = "
                f"{self.budget_policy!r} give 'width' as an integer"
            )
        budget = self.num_speculative_tokens
        if self.tree == "pruned" and not self.auto_width and self.width > budget:
            raise ValueError(
                f"'width' = {self.width} exceeds 'num_speculative_tokens' = {budget}: "
                "the per-depth width must be <= the verify budget"
            )
        return self

    @property
    def effective_depth_bonus(self) -> float:
        """beta as the tree builder uses it: 0 for every variant except pruned."""
        return self.depth_bonus if self.tree == "pruned" else 0.0


def parse_speculative_config(raw: dict[str, Any], *, on_cpu: bool = False) -> DARTreeConfig:
    """Validate a user's dartree speculative config dict (keys may use '-' or '_').

    ``on_cpu``: keys the user left out take :data:`CPU_DEFAULTS` where the tree variant
    uses them (the paper's defaults otherwise).
    """
    options = {str(k).replace("-", "_"): v for k, v in raw.items()}
    machine_defaults = set()
    if on_cpu:
        variant = options.get("tree", DARTreeConfig.model_fields["tree"].default)
        used = KNOBS_BY_VARIANT.get(variant, frozenset()) | {"num_speculative_tokens"}
        machine_defaults = {key for key in CPU_DEFAULTS if key in used and key not in options}
        options |= {key: CPU_DEFAULTS[key] for key in machine_defaults}
        if "width" in machine_defaults and isinstance(options["num_speculative_tokens"], int):
            options["width"] = min(options["width"], options["num_speculative_tokens"])
    passthrough = {k: options.pop(k) for k in list(options) if k in VLLM_PASSTHROUGH_KEYS}
    known = set(DARTreeConfig.model_fields) - {"vllm_options"}
    unknown = sorted(set(options) - known)
    if unknown:
        allowed = sorted(known | VLLM_PASSTHROUGH_KEYS)
        raise DARTreeConfigError(
            f"speculative_config key {unknown[0]!r} (value {options[unknown[0]]!r}) is not "
            f"supported with method 'dartree'; allowed keys: {', '.join(allowed)}"
        )
    try:
        config = DARTreeConfig(**options, vllm_options=passthrough)
    except ValidationError as exc:
        raise DARTreeConfigError(_describe(exc, options)) from None
    config._machine_defaults = frozenset(machine_defaults)
    if on_cpu:
        config._cpu_width = CPU_DEFAULTS["width"]
    return config


def _describe(exc: ValidationError, options: dict[str, Any]) -> str:
    """One line per problem: key, value given, what is allowed (a key whose type is a union,
    such as ``width``, gets one line naming every alternative)."""
    lines: dict[str, str] = {}
    for err in exc.errors():
        key = str(err["loc"][0]) if err["loc"] else "speculative_config"
        value = options.get(key, err.get("input"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            lines[key] = f"speculative_config key {key!r} is required for method 'dartree'"
        elif key == "speculative_config":
            lines[msg] = f"speculative_config: {msg}"
        elif key in lines:
            lines[key] += f", or {msg[0].lower()}{msg[1:]}"
        else:
            lines[key] = f"speculative_config key {key!r} = {value!r} is invalid: {msg}"
    return "; ".join(lines.values())


# ---- the settings' one channel into every engine process --------------------------------

_SETTINGS_ATTR = "dartree"
_LAYOUT_ATTR = "dartree_layout"


def carry_settings(speculative_config: Any, settings: DARTreeConfig,
                   layout: DrafterLayout) -> None:
    """Attach a dartree engine's validated settings and its drafter's layout (read and
    checked once, at config time) to vLLM's ``SpeculativeConfig``: the one object vLLM
    hands every engine process (pickled inside the ``VllmConfig``). Read back with
    :func:`carried_settings` and :func:`carried_layout`; nothing else touches these names.

    Why an attribute of vLLM's object, on every release: vLLM 0.32/0.33 have no
    per-method place for a method's own state. vLLM 0.34 has ``speculator_options``
    (validated by the registered config's ``supported_options``/``apply_options``), but it
    cannot carry these as they are: every value in it goes into
    ``SpeculativeConfig.compile_factors`` (the field is not in its ``ignored_factors``), so
    the tree settings would key vLLM's compile cache (a change of tree, width or top_k
    would recompile the target, as a change of B does not); its values must also be plain
    data (``normalize_value``), so neither this pydantic model (with its machine-default
    bookkeeping) nor the layout could travel, only dicts re-validated in every process.
    ``object.__setattr__``: the attribute is not a field of vLLM's pydantic dataclass."""
    object.__setattr__(speculative_config, _SETTINGS_ATTR, settings)
    object.__setattr__(speculative_config, _LAYOUT_ATTR, layout)


def carried_settings(speculative_config: Any) -> DARTreeConfig | None:
    """The settings :func:`carry_settings` attached (None: not a dartree engine)."""
    return getattr(speculative_config, _SETTINGS_ATTR, None)


def is_dartree_engine(vllm_config: Any) -> bool:
    """Whether ``vllm_config`` (vLLM's ``VllmConfig``) is a dartree engine's: the one test
    every patch uses before acting."""
    return carried_settings(getattr(vllm_config, "speculative_config", None)) is not None


def carried_layout(speculative_config: Any) -> DrafterLayout | None:
    """The drafter layout :func:`carry_settings` attached (None: not a dartree engine)."""
    return getattr(speculative_config, _LAYOUT_ATTR, None)
