"""The Triton tree-attention backend's glue, on CPU: kernel arguments built from a VerifyPlan
and vLLM's seq_lens/block table over vLLM's Triton cache layout, the impl's forward (stock
kernel stubbed, torch twin for the tree rows), the kernel itself under the interpreter on
the same arguments, GPU KV compaction on that layout, backend selection and inertness.

References are naive: per request and row, keys fetched slot by slot from the page view
``[num_blocks, kv_heads, block_size, 2 * head_size]``, softmax in float64.
"""

import math
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from interpreted import run_interpreted

from vllm_dartree.kernels.tree_attention import tree_attention_torch
from vllm_dartree.step.tree_context import tree_verify
from vllm_dartree.step.verify_plan import AcceptedPaths
from vllm_dartree.testing.plans import plan_of
from vllm_dartree.tree.types import padded_tree

pytest.importorskip("vllm.v1.attention.backends.triton_attn")
from vllm_dartree.integration import gpu_attention  # noqa: E402

SENTINEL = 7.0


@dataclass
class Spec:
    heads: int
    kv_heads: int
    head_size: int
    block_size: int
    budget: int
    prefixes: list[int]  # committed tokens before the root, per batch request
    drafts: list[int]  # scheduled drafts per batch request (0: not a tree request)
    layout: str = "HND"  # physical order of vLLM's logical page view


SPECS = [
    Spec(4, 2, 64, 16, 8, prefixes=[5, 37, 0, 70], drafts=[0, 8, 5, 3]),
    Spec(2, 2, 32, 16, 70, prefixes=[20, 100], drafts=[70, 41], layout="NHD"),
]


def random_tree(gen: torch.Generator, budget: int):
    parents = [int(torch.randint(0, j + 1, (), generator=gen)) for j in range(budget)]
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return padded_tree(torch.zeros(1, budget, dtype=torch.int64), torch.tensor([parents]),
                       torch.tensor([depths[1:]]), torch.ones(1, budget, dtype=torch.bool),
                       torch.zeros(1, budget), torch.zeros(1, dtype=torch.int64), budget, None)


def make_case(spec: Spec, seed: int) -> dict:
    """A batch whose tree requests are laid out as vLLM's V1 runner lays them out: each
    request's rows [prefix tokens scheduled this step..., root, drafts...] in batch order."""
    gen = torch.Generator().manual_seed(seed)
    trees, scheduled_rows = [], []
    seq_lens, row = [], 0
    for prefix, drafts in zip(spec.prefixes, spec.drafts):
        scheduled = 1 + drafts if drafts else 2  # a plain request schedules two tokens
        if drafts:
            trees.append(random_tree(gen, spec.budget))
        scheduled_rows.append(scheduled)
        seq_lens.append(prefix + scheduled)
        row += scheduled
    step = plan_of(trees, list(spec.drafts), scheduled_rows)
    blocks_per_req = [math.ceil(n / spec.block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(len(seq_lens), max(blocks_per_req) + 1, dtype=torch.int32)
    start = 0
    for b, count in enumerate(blocks_per_req):
        table[b, :count] = perm[start : start + count]
        start += count
    page = (num_blocks, spec.kv_heads, spec.block_size, 2 * spec.head_size)
    if spec.layout == "HND":
        kv_cache = torch.randn(page, generator=gen)
    else:  # physically [blocks, slots, heads, 2 * head]: the logical view is strided
        kv_cache = torch.randn(page[0], page[2], page[1], page[3], generator=gen).transpose(1, 2)
    return dict(step=step, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                block_table=table, kv_cache=kv_cache, head_size=spec.head_size,
                query=torch.randn(row, spec.heads, spec.head_size, generator=gen),
                scale=spec.head_size**-0.5)


def naive_tree_rows(case: dict) -> dict[int, torch.Tensor]:
    """{query row: [heads, head_size]} for every scheduled row of every tree request."""
    step, kv_cache, query = case["step"], case["kv_cache"], case["query"]
    head_size, block_size = case["head_size"], kv_cache.shape[2]
    group = query.shape[1] // kv_cache.shape[1]
    rows = {}
    for t, b in enumerate(step.batch_index.tolist()):
        drafts = int(step.num_drafts[t])
        base = int(case["seq_lens"][b]) - 1 - drafts
        table = case["block_table"][b].tolist()
        page = [kv_cache[table[p // block_size], :, p % block_size] for p in range(base + 1 + drafts)]
        keys = torch.stack([s[:, :head_size] for s in page]).double().repeat_interleave(group, 1)
        values = torch.stack([s[:, head_size:] for s in page]).double().repeat_interleave(group, 1)
        for i in range(1 + drafts):
            visible = list(range(base)) + [base + j for j in range(1 + drafts)
                                           if step.ancestors[t, i, j]]
            q_row = int(step.root_row[t]) + i
            logits = torch.einsum("hd,nhd->hn", query[q_row].double(), keys[visible])
            weights = torch.softmax(logits * case["scale"], dim=-1)
            rows[q_row] = torch.einsum("hn,nhd->hd", weights, values[visible])
    return rows


def kernel_inputs(case: dict) -> dict:
    args = gpu_attention.tree_kernel_args(case["step"], case["seq_lens"], case["block_table"])
    key_cache, value_cache = gpu_attention.split_kv_cache(case["kv_cache"], case["head_size"])
    return dict(query=case["query"], key_cache=key_cache, value_cache=value_cache,
                block_table=args.block_table, base=args.base, ancestor_bits=args.ancestor_bits,
                num_rows=args.num_rows, root_row=args.root_row, scale=case["scale"])


def assert_tree_rows(out: torch.Tensor, case: dict, atol: float = 1e-4) -> None:
    expected = naive_tree_rows(case)
    for row in range(out.shape[0]):
        if row in expected:
            err = (out[row].double() - expected[row]).abs().max().item()
            assert err < atol, (row, err)
        else:  # rows of plain requests are not the tree path's business
            assert torch.all(out[row] == SENTINEL), row


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    return [make_case(spec, seed) for seed, spec in enumerate(SPECS)]


def test_kernel_args_with_the_twin_match_naive_attention(cases):
    for case in cases:
        out = torch.full_like(case["query"], SENTINEL)
        tree_attention_torch(**kernel_inputs(case), out=out)
        assert_tree_rows(out, case)


def test_kernel_args_drive_the_interpreted_kernel(cases, tmp_path):
    """Same arguments (strided key/value views of the page) through the Triton kernel."""
    inputs, outputs = tmp_path / "inputs.pt", tmp_path / "out.pt"
    torch.save([kernel_inputs(case) for case in cases], inputs)
    script = textwrap.dedent(f"""
        import torch
        import vllm_dartree.kernels.tree_attention as ta
        from vllm_dartree.kernels import launch

        assert launch.interpreter_loaded()
        results = []
        for kwargs in torch.load({str(inputs)!r}):
            assert kwargs["key_cache"].stride() == kwargs["value_cache"].stride()
            out = torch.full_like(kwargs["query"], {SENTINEL})
            ta.tree_attention_triton(**kwargs, out=out)
            results.append(out)
        torch.save(results, {str(outputs)!r})
    """)
    for case, out in zip(cases, run_interpreted(script, outputs)):
        assert_tree_rows(out, case)


def make_impl(case: dict):
    heads, head_size = case["query"].shape[1:]
    return gpu_attention.TreeTritonAttentionImpl(
        num_heads=heads, head_size=head_size, scale=case["scale"],
        num_kv_heads=case["kv_cache"].shape[1], alibi_slopes=None, sliding_window=None,
        kv_cache_dtype="auto")


def run_forward(case: dict, monkeypatch, *, step, layer, impl=None) -> torch.Tensor:
    """The impl's forward with the stock Triton kernel stubbed (it needs a GPU)."""
    monkeypatch.setattr(gpu_attention.TritonAttentionImpl, "forward",
                        lambda self, layer, q, k, v, kv, meta, output, *rest: output)
    query = case["query"]
    output = torch.full((query.shape[0], query.shape[1] * query.shape[2]), SENTINEL)
    metadata = SimpleNamespace(seq_lens=case["seq_lens"], block_table=case["block_table"],
                               max_seq_len=int(case["seq_lens"].max()))
    impl = make_impl(case) if impl is None else impl
    with tree_verify(step):
        out = impl.forward(layer, query, None, None, case["kv_cache"], metadata, output)
    assert out is output
    return out.view(query.shape)


def test_forward_recomputes_tree_rows_only_in_a_verify_step(cases, monkeypatch):
    case = cases[0]
    target_layer = SimpleNamespace(is_draft_layer=False)
    assert_tree_rows(run_forward(case, monkeypatch, step=case["step"], layer=target_layer), case)
    for step, layer in ((None, target_layer),  # not a tree step: the stock rows stay
                        (case["step"], SimpleNamespace(is_draft_layer=True))):
        out = run_forward(case, monkeypatch, step=step, layer=layer)
        assert torch.all(out == SENTINEL)


def test_forward_refuses_unsupported_layers_only_in_tree_steps(cases, monkeypatch):
    case = cases[0]
    impl = make_impl(case)
    impl._tree_unsupported = ["sinks"]
    layer = SimpleNamespace(is_draft_layer=False)
    run_forward(case, monkeypatch, step=None, layer=layer, impl=impl)
    with pytest.raises(NotImplementedError, match="sinks"):
        run_forward(case, monkeypatch, step=case["step"], layer=layer, impl=impl)


def test_gpu_compaction_moves_whole_slots_per_slot_mapping(cases):
    case = cases[1]
    step = case["step"]
    paths = torch.full((step.num_requests, step.tree.budget + 1), -1, dtype=torch.int64)
    for t in range(step.num_requests):  # the deepest scheduled node's path, root first
        node = int(torch.argmax(step.tree.depths[t] * step.node_in_batch[t])) + 1
        path = []
        while node:
            path.append(node)
            node = int(step.tree.parents[t, node - 1])
        paths[t, : len(path) + 1] = torch.tensor([0, *reversed(path)])
    accepted = AcceptedPaths(step, paths, (paths >= 0).sum(dim=1))
    rows = int(case["query"].shape[0])
    num_slots = case["kv_cache"].shape[0] * case["kv_cache"].shape[2]
    mappings = [torch.randperm(num_slots, generator=torch.Generator().manual_seed(s))[:rows]
                for s in (0, 1)]
    layers = [case["kv_cache"].clone() for _ in range(3)]
    target_kv = [(layers[0], "", mappings[0]), (layers[1], "", mappings[0]),
                 (layers[2], "", mappings[1])]
    expected = [naive_compaction(kv, accepted, mapping) for kv, _, mapping in target_kv]
    gpu_attention.GpuKvMover()(accepted, target_kv)
    assert all(torch.equal(got, want) for got, want in zip(layers, expected))
    assert not torch.equal(layers[0], case["kv_cache"])  # something really moved


def naive_compaction(kv_cache: torch.Tensor, accepted: AcceptedPaths, slot_mapping
                     ) -> torch.Tensor:
    """Path position d's slot gets the node's slot content (keys and values, all heads)."""
    old, new = kv_cache.clone(), kv_cache.clone()
    block_size = kv_cache.shape[2]
    for t, root in enumerate(accepted.plan.root_row.tolist()):
        for depth, node in enumerate(accepted.accepted_nodes[t].tolist()):
            if depth == 0 or node < 0:
                continue
            src, dst = int(slot_mapping[root + node]), int(slot_mapping[root + depth])
            new[dst // block_size, :, dst % block_size] = old[src // block_size, :,
                                                              src % block_size]
    return new


# ----------------------------------------------------------------- selection, registration
def engine_args(backend=None, config_backend=None, per_kind=None, kv_cache_dtype="auto"):
    from vllm.config.attention import AttentionConfig

    config = AttentionConfig(backend=config_backend, backend_per_kind=per_kind or {})
    return SimpleNamespace(attention_backend=backend, attention_config=config,
                           kv_cache_dtype=kv_cache_dtype)


def test_triton_backend_is_selected_or_a_conflicting_choice_refused():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_dartree.config import DARTreeConfigError

    args = engine_args()
    gpu_attention.select_triton_backend(args)
    assert args.attention_backend == AttentionBackendEnum.TRITON_ATTN
    for kwargs in ({"backend": "TRITON_ATTN"}, {"config_backend": "auto"},
                   {"config_backend": AttentionBackendEnum.TRITON_ATTN}):
        args = engine_args(**kwargs)
        before = args.attention_backend
        gpu_attention.select_triton_backend(args)
        assert args.attention_backend in (before, AttentionBackendEnum.TRITON_ATTN)
    for kwargs, field in (({"backend": "FLASH_ATTN"}, "'attention_backend' = FLASH_ATTN"),
                          ({"config_backend": "FLASHINFER"},
                           "'attention_config.backend' = FLASHINFER"),
                          ({"per_kind": {"sliding_window": "FLASH_ATTN"}},
                           "'attention_config.backend_per_kind.sliding_window' = FLASH_ATTN")):
        # (a quantized kv_cache_dtype is refused on every platform: tests/integration/
        # test_refusals.py)
        with pytest.raises(DARTreeConfigError, match=field):
            gpu_attention.select_triton_backend(engine_args(**kwargs))


def test_platform_gate(monkeypatch):
    from vllm.platforms import current_platform

    from vllm_dartree.config import DARTreeConfigError
    from vllm_dartree.integration import refusals, speculative_config

    tree = SimpleNamespace(tree="pruned")
    refusals.refuse_unverifiable_platform(tree)  # CPU
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    refusals.refuse_unverifiable_platform(tree)
    args = engine_args()
    speculative_config.select_tree_attention_backend(tree, args)
    assert args.attention_backend.name == "TRITON_ATTN"
    chain_args = engine_args(backend="FLASH_ATTN")  # a chain needs no tree mask: left alone
    speculative_config.select_tree_attention_backend(SimpleNamespace(tree="chain"), chain_args)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)  # e.g. ROCm
    with pytest.raises(DARTreeConfigError, match="'tree' = 'pruned' needs tree attention"):
        refusals.refuse_unverifiable_platform(tree)
    refusals.refuse_unverifiable_platform(SimpleNamespace(tree="chain"))


def test_registration_points_triton_attn_at_the_subclass():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_dartree.integration import activation

    entry = AttentionBackendEnum.TRITON_ATTN
    # An in-process engine earlier in the session may have activated dartree already:
    # then the override stays (activation is per process) and only its target is checked.
    applied_here = not activation.TritonTreeAttention.is_applied()
    if applied_here:
        assert not entry.is_overridden()
    try:
        if applied_here:
            activation.TritonTreeAttention.apply()
        assert entry.get_class() is gpu_attention.TreeTritonAttentionBackend
        builder = entry.get_class().get_builder_cls()
        assert builder.get_cudagraph_support(None, None).name == "NEVER"
    finally:
        if applied_here:
            activation.TritonTreeAttention.revert()
    assert entry.is_overridden() != applied_here


INERTNESS_PROBE = textwrap.dedent("""
    import sys
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

    load_general_plugins()
    loaded = (E.TRITON_ATTN.is_overridden(), E.CPU_ATTN.is_overridden())
    from vllm_dartree.integration import activation

    activation.activate()  # what a dartree request does, here on the CPU platform
    activated = (E.TRITON_ATTN.is_overridden(), E.CPU_ATTN.is_overridden())
    print("RESULT", loaded, activated,
          "vllm_dartree.integration.gpu_attention" in sys.modules)
""")


def test_backends_are_registered_by_name_at_activation():
    """Plugin load patches no backend; activating dartree points both tree backends' registry
    entries at our subclasses (the engine's own backend choice decides which one runs) by
    name: the Triton module is not imported on a CPU engine that never uses it."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "VLLM_DARTREE_ACTIVE"}
    proc = subprocess.run([sys.executable, "-c", INERTNESS_PROBE], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line == "RESULT (False, False) (True, True) False"
