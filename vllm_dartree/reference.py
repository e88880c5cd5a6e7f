"""DARTree decoding in plain lines: the oracle the plugin is tested against.

No vLLM, no KV cache, no batching: one request, greedy, round by round, readable top to
bottom (in the spirit of gpt-fast's ``generate.py``). The target is a Hugging Face causal LM,
the drafter is the training :class:`~vllm_dartree.training.model.DominoDrafter` (the same math
as the drafter inside vLLM), and the tree code is the plugin's own ``vllm_dartree.tree``.
One round:

1. draft. The drafter conditions on the target's hidden states (the outputs of decoder
   layers ``target_layer_ids``) of every committed token before the root; its block is
   ``[root, mask x (bs - 1)]`` at positions ``root_pos .. root_pos + bs - 1``, and in the
   shift layout slot j predicts position ``root_pos + j + 1``: depth j + 1 of the tree.
2. tree. ``build_tree`` turns the per-depth logits (and, with the Domino head, the per-depth
   hidden states) into a tree of B nodes, exactly as the plugin's proposer calls it, and
   orders it depth-first as the proposer does (``depth_first``: only which verify rows the
   attention backends recompute depends on the order, never a tree or a token).
3. verify. One target forward over ``[committed prefix, root, tree nodes]``: a node sits at
   ``root_pos + depth`` and sees the whole prefix plus its own ancestors (an explicit 4-D
   mask). The prefix is recomputed every round: slower, but no cache to compact.
4. accept. ``accept_tree`` walks from the root along the target's greedy choices; the
   path's drafted tokens and the bonus (the target's choice at the path's end) are
   committed, and the hidden states of the prefix and path rows become the next context.

At temperature 0 the output is the target's greedy continuation whatever the drafter
proposes: every committed token is the target's argmax after the tokens before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_dartree.training.model import DominoDrafter
from vllm_dartree.tree import (
    DraftTree,
    accept_tree,
    ancestor_mask,
    build_tree,
    depth_first,
    verify_positions,
    verify_tokens,
)


@dataclass
class Round:
    """One draft-verify round. Nodes are the tree's real nodes in column order (node i is
    column i - 1; the root is node 0 and is not listed)."""

    root_position: int
    root_token: int
    tokens: list[int]  # drafted token of each node
    parents: list[int]  # parent node index (0 = root)
    depths: list[int]  # 1 .. D
    scores: list[float]  # path score the builder ranked the node by (log-probs summed)
    accepted_nodes: list[int]  # the accepted path, root 0 first
    accepted: list[int]  # tokens committed this round: the path's drafts, then the bonus


@dataclass
class Decoded:
    output: list[int]  # the first max_new_tokens generated ids (the prompt excluded)
    rounds: list[Round]


@torch.no_grad()
def target_forward(
    target, layer_ids: Sequence[int], ids: torch.Tensor, positions: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the HF target over ``ids`` [L] at ``positions`` [L].

    Returns the logits [L, V] and the drafter's features [L, len(layer_ids) * H]: the
    outputs of those decoder layers (before the final norm; what vLLM hands its drafter as
    aux hidden states), concatenated. ``mask`` None means causal; otherwise it is an
    additive float mask [1, 1, L, L], which transformers uses as given.
    """
    captured: dict[int, torch.Tensor] = {}

    def keep(index: int):
        def hook(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output
        return hook

    layers = target.model.layers
    handles = [layers[i].register_forward_hook(keep(i)) for i in layer_ids]
    try:
        out = target(input_ids=ids.unsqueeze(0), position_ids=positions.unsqueeze(0),
                     attention_mask=mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    features = torch.cat([captured[i].reshape(len(ids), -1) for i in layer_ids], dim=-1)
    return out.logits[0].float(), features.float()


def verify_mask(tree: DraftTree, root_position: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, L, L] over ``[prefix (root_position rows), root, B nodes]``.

    Prefix rows are causal among themselves. Every tree row sees the whole prefix and,
    inside the tree, only itself and its ancestors: a node's output is then exactly what
    the target computes on the sequence ``prefix, root, ancestors..., node``.
    """
    prefix, size = root_position, 1 + tree.budget
    visible = torch.zeros(prefix + size, prefix + size, dtype=torch.bool)
    visible[:prefix, :prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
    visible[prefix:, :prefix] = True
    visible[prefix:, prefix:] = ancestor_mask(tree)[0]
    blocked = torch.full(visible.shape, torch.finfo(dtype).min, dtype=dtype)
    return torch.where(visible, torch.zeros((), dtype=dtype), blocked)[None, None]


@torch.no_grad()
def reference_decode(
    target,
    drafter: DominoDrafter,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    tree: str = "pruned",
    budget: int = 64,
    width: int = 12,
    top_k: int = 64,
    depth_bonus: float = -0.2,
    correction: bool = True,
) -> Decoded:
    """Greedy DARTree decoding of ``prompt``, as the plugin does it with the speculative
    config ``{"tree": tree, "num_speculative_tokens": budget, "width": width, "top_k":
    top_k, "depth_bonus": depth_bonus, "correction": correction}``.

    ``tree`` is one of the plugin's variants: ``pruned``, ``fixed``, ``ddtree`` or ``chain``
    (``chain`` with ``correction`` is Domino, without it DFlash). The drafter must be in the
    shift layout (every Domino checkpoint is): slot j of the block is depth j + 1.
    """
    layer_ids = drafter.arch.target_layer_ids
    dtype = next(target.parameters()).dtype
    # What the plugin derives from its settings (config.DARTreeConfig, proposer.py): the
    # depth bonus only applies to pruned trees, top-K cannot exceed the vocabulary, and the
    # Domino head runs from the input-gate table (the same arithmetic as the plugin's head).
    depth_bonus = depth_bonus if tree == "pruned" else 0.0
    top_k = min(top_k, drafter.arch.vocab_size)
    head = drafter.domino_head().with_input_gate_table() if correction else None

    # Prefill: the target alone gives the first token, and the prompt's hidden states are
    # the drafter's first context.
    tokens = list(prompt)
    logits, context = target_forward(target, layer_ids, torch.tensor(tokens),
                                     torch.arange(len(tokens)))
    tokens.append(int(logits[-1].argmax()))

    rounds: list[Round] = []
    while len(tokens) - len(prompt) < max_new_tokens:
        # The root is the last committed token; the context covers every position before it.
        root_position = len(tokens) - 1
        root = torch.tensor([tokens[root_position]])
        assert context.shape[0] == root_position

        # 1. Draft: one drafter forward over [root, mask x (bs - 1)] anchored at the root.
        drafted = drafter(context.unsqueeze(0), torch.tensor([tokens]),
                          torch.tensor([[root_position]]), with_head=False)
        base_logits = drafted.base_logits[:, 0].float()  # [1, D, V]: depth d is row d - 1
        draft_hidden = drafted.hidden[:, 0].float()  # [1, D, H]: the Domino head's input

        # 2. Tree: B nodes, padded with invalid dummies when the variant finds fewer (they
        # are verified below like real nodes, but accept_tree never walks into one).
        draft = build_tree(tree, base_logits, draft_hidden, root, head, budget=budget,
                           top_k=top_k, width=width, depth_bonus=depth_bonus)
        if tree != "chain":
            draft = depth_first(draft)

        # 3. Verify: prefix at 0 .. root_pos - 1, root at root_pos, node at root_pos + depth.
        ids = torch.cat([torch.tensor(tokens[:root_position]), verify_tokens(draft, root)[0]])
        positions = torch.cat([torch.arange(root_position),
                               verify_positions(draft, torch.tensor([root_position]))[0]])
        logits, features = target_forward(target, layer_ids, ids, positions,
                                          verify_mask(draft, root_position, dtype))
        choice = logits[root_position:].argmax(dim=-1)  # target's token after root / node i

        # 4. Accept: the longest path whose tokens are the target's own choices, plus the
        # bonus. The path's rows hold the hidden states of the newly committed tokens (the
        # bonus has none yet: it is the next root).
        result = accept_tree(draft, choice.unsqueeze(0))
        length = int(result.num_accepted[0])
        path = result.accepted_nodes[0, :length]
        accepted = result.accepted_tokens[0, :length].tolist()
        tokens += accepted
        context = torch.cat([features[:root_position], features[root_position + path]])

        real = draft.valid[0]
        rounds.append(Round(
            root_position=root_position, root_token=int(root),
            tokens=draft.tokens[0, real].tolist(), parents=draft.parents[0, real].tolist(),
            depths=draft.depths[0, real].tolist(), scores=draft.scores[0, real].tolist(),
            accepted_nodes=path.tolist(), accepted=accepted,
        ))
    return Decoded(output=tokens[len(prompt):][:max_new_tokens], rounds=rounds)
