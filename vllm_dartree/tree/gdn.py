"""Tree verification through a Gated-DeltaNet layer (Qwen3-Next / Qwen3.5 linear attention):
the pure-torch reference.

A GDN layer carries two pieces of state per request across steps: the last ``W - 1``
inputs of its depthwise causal conv (``W`` = the conv kernel width, 4 in every Qwen
checkpoint) and the recurrent state ``S`` [H, K, V]. A chain verify runs them row after row.
A tree cannot: row ``r``'s output must see only its own root-to-``r`` path, so

- **conv**: ``y_r = act(bias + sum_w weight[:, W-1-w] * x_{a_w(r)})`` where ``a_0(r) = r``,
  ``a_{w+1} = parent(a_w)``; ancestors above the root are the committed conv inputs;
- **recurrence**: ``S_r = e^{g_r} S_p + k_r (beta_r (v_r - e^{g_r} S_p^T k_r))^T`` with
  ``p = parent(r)`` (``S0``, the committed state, for the root) and ``o_r = S_r^T q_r``.

Verification reads the committed state and writes nothing (:func:`tree_conv`,
:func:`tree_gated_delta_rule`); after acceptance :func:`commit_path` replays the accepted
path (root first) from the committed state, which leaves exactly the state and conv window
that a chain of those tokens would have left, so rejected nodes need no rollback. Memory per
request: one state slot (``H*K*V`` floats per layer) instead of one per draft position.

Rows follow :class:`~vllm_dartree.tree.types.DraftTree`: row 0 is the root (the last
committed token, the step's first verified row), rows ``1..B`` the nodes, each parent
before its child; ``parents_with_root()`` gives every row's parent (the root's is itself,
and is never read here). Batched over requests, every loop bound static, no host sync.
Head layout: ``q``/``k`` already expanded to the value heads (GQA ``repeat_interleave``) and
normalised/scaled as the layer does it; ``g`` (log decay,
``-exp(A_log) * softplus(a + dt_bias)`` <= 0) and ``beta`` (``sigmoid(b)``) as the layer's
gates compute them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv_ancestors(parents: torch.Tensor, width: int) -> torch.Tensor:
    """int64 [R, T, width]: where each row's conv window reads, newest first.

    Index ``e`` is into ``[committed inputs (width - 1, oldest first), row inputs (T)]``:
    ``e = width - 1 + a`` with ``a`` the ancestor's row, or ``a = -k`` for the k-th committed
    input above the root (one formula for both). ``parents`` [R, T] is
    ``DraftTree.parents_with_root()``.
    """
    num_requests, rows = parents.shape
    current = torch.arange(rows, device=parents.device).expand(num_requests, rows)
    windows = []
    for _ in range(width):
        windows.append(width - 1 + current)
        up = parents.gather(1, current.clamp(min=0))
        # The root (row 0) and every committed input go one further up the committed inputs.
        current = torch.where(current > 0, up, current - 1)
    return torch.stack(windows, dim=-1)


def _conv_of_windows(windows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     activation: str | None) -> torch.Tensor:
    """fp32 conv outputs of ``windows`` [..., W, C] (newest input first): weight [C, W],
    optional bias [C], then the activation ('silu' or None)."""
    out = (windows.float() * weight.float().flip(-1).t()).sum(dim=-2)
    if bias is not None:
        out = out + bias.float()
    if activation == "silu":
        return F.silu(out)
    if activation is not None:
        raise ValueError(f"activation={activation!r}: 'silu' or None")
    return out


def tree_conv(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None, parents: torch.Tensor,
              activation: str | None = "silu") -> torch.Tensor:
    """The depthwise causal conv of every tree row along its own ancestor path.

    x [R, T, C] the rows' inputs; conv_state [R, C, W-1] the committed inputs, oldest first
    (read only); weight [C, W] (``weight[:, -1]`` multiplies the row itself); bias [C].
    Returns [R, T, C] in the inputs' dtype, computed in fp32.
    """
    width = weight.shape[-1]
    inputs = torch.cat([conv_state.transpose(1, 2), x], dim=1).float()  # [R, W-1+T, C]
    window = conv_ancestors(parents, width)  # [R, T, W] newest first
    channels = x.shape[-1]
    gathered = inputs.gather(1, window.flatten(1).unsqueeze(-1).expand(-1, -1, channels))
    gathered = gathered.view(*window.shape, channels)  # [R, T, W, C]
    return _conv_of_windows(gathered, weight, bias, activation).to(x.dtype)


def _delta_step(state: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor) -> torch.Tensor:
    """One gated delta-rule update: state [N, H, K, V]; k [N, H, K]; v [N, H, V]; g, beta [N, H]."""
    state = state * g.exp()[..., None, None]
    recalled = torch.einsum("nhkv,nhk->nhv", state, k)
    delta = (v - recalled) * beta.unsqueeze(-1)
    return state + k.unsqueeze(-1) * delta.unsqueeze(-2)


def tree_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, initial_state: torch.Tensor,
                          parents: torch.Tensor, return_states: bool = False
                          ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Every tree row's recurrence output from the committed state (which it does not write).

    q, k [R, T, H, K]; v [R, T, H, V]; g, beta [R, T, H]; initial_state [R, H, K, V];
    parents [R, T] as ``DraftTree.parents_with_root()``. Returns o [R, T, H, V] in ``v``'s
    dtype, computed in fp32. One update per row in topological order, each from its
    parent's state (rows' states live only inside this call: T of them, a reference's price).
    ``return_states``: also every row's state [R, T, H, K, V] (fp32), for an engine that
    keeps one state slot per verified row (vLLM's hybrid speculation on CPU does).
    """
    rows = q.shape[1]
    out_dtype = v.dtype
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    # states[:, 1 + r] is row r's state, states[:, 0] the committed one.
    states = initial_state.float().unsqueeze(1).repeat(1, 1 + rows, 1, 1, 1)
    parent_index = torch.where(torch.arange(rows, device=q.device) > 0, 1 + parents, 0)
    outputs = []
    for row in range(rows):
        # Static loop, data-dependent parent: a gather (earlier rows are already final).
        index = parent_index[:, row].view(-1, 1, 1, 1, 1).expand(-1, 1, *states.shape[2:])
        parent_state = states.gather(1, index).squeeze(1)
        state = _delta_step(parent_state, k[:, row], v[:, row], g[:, row], beta[:, row])
        states[:, 1 + row] = state
        outputs.append(torch.einsum("rhkv,rhk->rhv", state, q[:, row]))
    out = torch.stack(outputs, dim=1).to(out_dtype)
    return (out, states[:, 1:]) if return_states else out


def _at_row(t: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """t [R, T, ...] at each request's row [R] -> [R, ...] (fp32)."""
    index = row.view(-1, 1, *([1] * (t.dim() - 2)))
    return t.gather(1, index.expand(-1, 1, *t.shape[2:])).squeeze(1).float()


def commit_path(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, conv_state: torch.Tensor, initial_state: torch.Tensor,
                accepted_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv inputs and recurrent state after the accepted path, as a chain would leave
    them: the path's rows replayed from the committed state.

    x [R, T, C] the rows' conv inputs; k, v, g, beta as :func:`tree_gated_delta_rule` takes
    them; conv_state [R, C, W-1]; initial_state [R, H, K, V]; accepted_rows [R, L] the
    path's rows, root first, ``-1`` after its end (``AcceptResult.accepted_nodes``). Returns
    (conv_state, state) of the same shapes and dtypes; the inputs are not modified.
    """
    width_minus_one = conv_state.shape[-1]
    path_len = (accepted_rows >= 0).sum(dim=1)  # [R] >= 1: the root is always accepted
    rows = accepted_rows.clamp(min=0)
    # Conv: the last W-1 of [committed inputs, path inputs].
    path_x = x.gather(1, rows.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # [R, L, C]
    inputs = torch.cat([conv_state.transpose(1, 2), path_x], dim=1)  # [R, W-1+L, C]
    last = path_len.unsqueeze(1) + torch.arange(width_minus_one, device=x.device)  # [R, W-1]
    new_conv = inputs.gather(1, last.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    # Recurrence: one update per path position; positions past the path's end leave it.
    state = initial_state.float()
    for step in range(accepted_rows.shape[1]):
        row = rows[:, step]
        take = (step < path_len).view(-1, 1, 1, 1)
        stepped = _delta_step(state, *(_at_row(t, row) for t in (k, v, g, beta)))
        state = torch.where(take, stepped, state)
    return new_conv.transpose(1, 2).to(conv_state.dtype), state.to(initial_state.dtype)


# ---- flat rows in an engine's state slots ---------------------------------------------------
# An engine verifies a batch's rows flat (request after request) and keeps one recurrent state
# slot per verified row of a request (vLLM's hybrid speculation). These twins of
# ``kernels/gdn_tree.py`` take that layout: per row, where its conv window reads and which
# slots its state comes from and goes to.

def tree_conv_rows(x: torch.Tensor, conv_state: torch.Tensor, window_slot: torch.Tensor,
                   window_start: torch.Tensor, row_request: torch.Tensor,
                   sources: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str | None = "silu") -> torch.Tensor:
    """Every row's depthwise causal conv along its own ancestor path, in fp32.

    x [N, C] the rows' inputs; conv_state [slots, C, L] (read only); request s's committed
    inputs are ``conv_state[window_slot[s], :, window_start[s] + j]`` for j = 0..W-2 (oldest
    first); row_request [N]; sources [N, W] newest first: ``i >= 0`` reads row i of ``x``,
    ``-1 - j`` the committed input j of the row's request; weight [C, W] (``weight[:, -1]``
    multiplies the row itself); bias [C]. Returns [N, C] in ``x``'s dtype.
    """
    committed = (window_start[row_request].unsqueeze(1) + (-1 - sources).clamp(min=0))
    slots = window_slot[row_request].unsqueeze(1).expand_as(sources)
    from_window = conv_state[slots, :, committed]  # [N, W, C]
    from_rows = x[sources.clamp(min=0)]  # [N, W, C]
    gathered = torch.where((sources >= 0).unsqueeze(-1), from_rows.float(), from_window.float())
    return _conv_of_windows(gathered, weight, bias, activation).to(x.dtype)


def tree_delta_rule_in_slots(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                             row_slot: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
    """Every row's recurrence output, each row's state stored in its own slot.

    q, k [N, H, K] (normalised, q scaled, expanded to the value heads); v [N, H, V]; g, beta
    [N, H]; state [slots, H, V, K] (vLLM's layout, any float dtype), updated in place: row r
    steps from ``state[parent_slot[r]]`` (the committed state for a root, else its parent
    row's slot, written earlier: parents come before their children) and stores its state,
    rounded to the cache dtype, in ``state[row_slot[r]]``. Returns o [N, H, V] in ``v``'s
    dtype, computed in fp32.
    """
    out_dtype = v.dtype
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    for row in range(q.shape[0]):  # a reference: one row after another
        parent = state[parent_slot[row]].float().transpose(-1, -2)  # [H, K, V]
        new = _delta_step(parent[None], k[row, None], v[row, None], g[row, None],
                          beta[row, None])[0]
        out[row] = torch.einsum("hkv,hk->hv", new, q[row])
        state[row_slot[row]] = new.transpose(-1, -2).to(state.dtype)
    return out.to(out_dtype)
