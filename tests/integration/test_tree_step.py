"""The tree step's index arithmetic on hand-built batches, with no engine: plan, depth
positions, acceptance, KV compaction and the drafter's next context, checked against naive
per-request walks; stale state; and no host sync anywhere in the step."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_dartree.step import tree_context
from vllm_dartree.step.tree_step import TreeStep
from vllm_dartree.step.verifier import TreeVerifier
from vllm_dartree.step.verify_plan import compaction_pairs
from vllm_dartree.testing.syncs import HostSyncCounter
from vllm_dartree.tree import DraftTree, build_tree
from vllm_dartree.tree.types import padded_tree

BUDGET = 6
VOCAB = 40


def random_tree(gen: torch.Generator, real_nodes: int) -> DraftTree:
    """One request's tree: ``real_nodes`` nodes (topological, siblings with distinct tokens)
    padded to BUDGET."""
    parents, depths, tokens = [], [], []
    used: dict[int, set[int]] = {}
    node_depth = {0: 0}
    for j in range(real_nodes):
        parent = int(torch.randint(0, j + 1, (), generator=gen))
        token = int(torch.randint(1, VOCAB, (), generator=gen))
        while token in used.setdefault(parent, set()):
            token = token % (VOCAB - 1) + 1
        used[parent].add(token)
        parents.append(parent)
        depths.append(node_depth[parent] + 1)
        node_depth[j + 1] = node_depth[parent] + 1
        tokens.append(token)
    return padded_tree(torch.tensor([tokens]), torch.tensor([parents]), torch.tensor([depths]),
                       torch.ones(1, real_nodes, dtype=torch.bool),
                       torch.zeros(1, real_nodes), torch.tensor([0]), BUDGET, 4 * BUDGET)


# The batch: r0 prefills 7 rows (no drafts); r1 verifies a 4-node tree padded to 6 nodes
# with all 6 draft rows scheduled; r2 has a full tree but vLLM scheduled only 3 drafts;
# r3 has no tree in the proposal (a chain over vLLM's scheduled tokens); r4 decodes with
# no drafts (one row).
REQ_IDS = ["r0", "r1", "r2", "r3", "r4"]
NUM_DRAFTS = [0, 6, 3, 4, 0]
NUM_SCHEDULED = np.array([7, 7, 4, 5, 1])
CHAIN_TOKENS = {"r3": [11, 12, 13, 14]}


def accept(step: TreeStep, logits: torch.Tensor, sampling, max_spec_len: int):
    """What V1's glue does: (sampled, paths) from the tree verifier's target choice."""
    return step.accept_with(lambda plan: step.verifier.target_choice(logits, plan, sampling),
                            max_spec_len + 1)


def draft_context(step: TreeStep, hidden: torch.Tensor) -> torch.Tensor:
    """What both runners' drafters do: the accepted paths' rows first."""
    order = step.accepted_order(hidden.shape[0])
    return hidden if order is None else hidden[order]


def make_step(gen: torch.Generator):
    moves = []
    step = TreeStep(BUDGET, torch.device("cpu"), TreeVerifier(),
                    lambda accepted, kv: moves.append((accepted, kv)))
    trees = {"r1": random_tree(gen, 4), "r2": random_tree(gen, 6), "r0": random_tree(gen, 2)}
    proposal_ids = ["r2", "r0", "r1"]  # the drafter's own batch order
    stacked = DraftTree(*(torch.cat([getattr(trees[r], f) for r in proposal_ids])
                          for f in ("tokens", "parents", "depths", "num_nodes", "valid",
                                    "scores")), max_depth=4 * BUDGET)
    step.plan(REQ_IDS, None, NUM_SCHEDULED, {}, verify_as_chain=False)  # step 1: no drafts
    step.hand_over(proposal_ids, stacked)
    return step, trees, moves


def naive_layout():
    """(root row, node rows, logits rows) per drafted request, from the batch by hand."""
    rows, logits, out = 0, 0, {}
    for req, n, scheduled in zip(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED):
        if n:
            root = rows + scheduled - n - 1
            out[req] = (root, list(range(root + 1, root + 1 + n)), list(range(logits,
                                                                              logits + n + 1)))
        rows += scheduled
        logits += n + 1
    return out, rows, logits


def expected_tree(req, trees):
    """(parent, depth, token, valid) of every column: the proposal's tree, or for r3 the
    chain over vLLM's scheduled tokens; padding columns are dummies (root, depth 1)."""
    if req == "r3":
        return [(j, j + 1, t, True) for j, t in enumerate(CHAIN_TOKENS["r3"])]
    tree = trees[req]
    return [(int(tree.parents[0, j]), int(tree.depths[0, j]), int(tree.tokens[0, j]),
             bool(tree.valid[0, j])) for j in range(BUDGET)]


def scheduled_nodes(req, trees, n):
    """The first n columns with padding made invalid dummies (as the plan truncates)."""
    return [(p, d, tok, ok) if ok else (0, 1, tok, False)
            for p, d, tok, ok in expected_tree(req, trees)[:n]]


def test_plan_lays_out_every_request_like_the_runner_does():
    gen = torch.Generator().manual_seed(0)
    step, trees, _ = make_step(gen)
    plan = step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, verify_as_chain=False)
    layout, _, num_logits = naive_layout()
    assert plan.req_ids == ["r1", "r2", "r3"]
    assert plan.batch_index.tolist() == [1, 2, 3]
    assert plan.num_logit_rows == num_logits
    assert plan.first_logit_row.tolist() == [0, 1, 8, 12, 17]
    assert plan.request_of_logit_row.tolist() == [0] + [1] * 7 + [2] * 4 + [3] * 5 + [4]
    for t, req in enumerate(plan.req_ids):
        root, node_rows, logit_rows = layout[req]
        n = len(node_rows)
        assert int(plan.root_row[t]) == root
        assert plan.node_rows[t, :n].tolist() == node_rows
        assert plan.node_logit_rows[t, : n + 1].tolist() == logit_rows
        # Unscheduled columns alias the last scheduled row (identical duplicate writes).
        assert set(plan.node_rows[t, n:].tolist()) <= {node_rows[-1]}
        kept = [(p, d, tok) for j, (p, d, tok) in enumerate(
            zip(plan.tree.parents[t].tolist(), plan.tree.depths[t].tolist(),
                plan.tree.tokens[t].tolist())) if plan.tree.valid[t, j]]
        # The scheduled prefix of the request's tree (r2: 3 of 6 nodes; r1: 4 real nodes).
        assert kept == [(p, d, tok) for p, d, tok, ok in scheduled_nodes(req, trees, n) if ok]


def naive_walk(tree_nodes, choice_at):
    """Accepted node indices (root 0 first) and emitted tokens of one request."""
    path, tokens, node = [0], [], 0
    while True:
        wanted = choice_at(node)
        tokens.append(wanted)
        children = [j + 1 for j, (p, _, tok, ok) in enumerate(tree_nodes) if p == node
                    and tok == wanted and ok]
        if not children:
            return path, tokens
        node = children[0]
        path.append(node)


@pytest.mark.parametrize("seed", range(4))
def test_a_whole_step_against_naive_walks(seed):
    gen = torch.Generator().manual_seed(seed)
    step, trees, moves = make_step(gen)
    plan = step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, verify_as_chain=False)
    layout, num_rows, num_logits = naive_layout()

    # Target forward: depth positions inside, sequential positions after.
    positions = torch.arange(num_rows) + 100
    with step.target_forward(positions, kv_caches=lambda: "the layers") as active:
        assert tree_context.plan_for(None) is active is plan
        for req in plan.req_ids:
            root, node_rows, _ = layout[req]
            nodes = scheduled_nodes(req, trees, len(node_rows))
            assert positions[node_rows].tolist() == [100 + root + d for _, d, _, _ in nodes]
    assert tree_context.plan_for(None) is None
    assert torch.equal(positions, torch.arange(num_rows) + 100)

    # The target prefers, at each verify row, a child's token half the time.
    choice = torch.randint(1, VOCAB, (num_logits,), generator=gen)
    for req in plan.req_ids:
        _, node_rows, logit_rows = layout[req]
        nodes = scheduled_nodes(req, trees, len(node_rows))
        for node, row in enumerate(logit_rows):
            kids = [tok for p, _, tok, ok in nodes if p == node and ok]
            if kids and torch.rand((), generator=gen) < 0.7:
                choice[row] = kids[int(torch.randint(0, len(kids), (), generator=gen))]
    logits = torch.nn.functional.one_hot(choice, VOCAB).float()
    greedy = SimpleNamespace(all_greedy=True)
    sampled, _ = accept(step, logits, greedy, max_spec_len=6)

    (accepted, kv), = moves
    assert kv == "the layers"
    for b, req in enumerate(REQ_IDS):
        if req not in layout:
            row = int(plan.first_logit_row[b])
            assert sampled[b].tolist() == [int(choice[row])] + [-1] * 6
            continue
        t = plan.req_ids.index(req)
        _, node_rows, logit_rows = layout[req]
        nodes = scheduled_nodes(req, trees, len(node_rows))
        path, tokens = naive_walk(nodes, lambda node, rows=logit_rows: int(choice[rows[node]]))
        assert sampled[b].tolist() == (tokens + [-1] * 7)[:7]
        assert [n for n in accepted.accepted_nodes[t].tolist() if n >= 0] == path

    # KV compaction: path position d moves to the slot of row root + d.
    slot_of_row = torch.randperm(200, generator=gen)[:num_rows]
    kv_rows = torch.arange(200) * 10  # a fake cache: the slot's content names its row's slot
    src, dst = compaction_pairs(accepted, slot_of_row)
    kv_rows[dst] = kv_rows[src].clone()
    for t, req in enumerate(plan.req_ids):
        root = layout[req][0]
        path = [n for n in accepted.accepted_nodes[t].tolist() if n >= 0]
        for d, node in enumerate(path):
            assert int(kv_rows[slot_of_row[root + d]]) == 10 * int(slot_of_row[root + node])

    # The drafter's context: each segment's path first, then the rest in order.
    hidden = torch.arange(num_rows, dtype=torch.float32).unsqueeze(1)
    reordered = draft_context(step, hidden)[:, 0].long().tolist()
    expected = list(range(num_rows))
    for t, req in enumerate(plan.req_ids):
        root, node_rows, _ = layout[req]
        path = [root + n for n in accepted.accepted_nodes[t].tolist() if n >= 0]
        segment = [root, *node_rows]
        expected[root : root + len(segment)] = path + [r for r in segment if r not in path]
    assert reordered == expected
    assert torch.equal(draft_context(step, hidden), hidden)  # consumed: no second reorder


def test_a_step_without_tree_verification_clears_the_step_state():
    gen = torch.Generator().manual_seed(5)
    step, _, moves = make_step(gen)
    step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, verify_as_chain=False)
    logits = torch.zeros(18, VOCAB)
    accept(step, logits, SimpleNamespace(all_greedy=True), max_spec_len=6)
    assert moves  # accepted paths are waiting for the drafter's context
    # vLLM skipped drafting (near max_model_len): the next step verifies nothing ...
    assert step.plan(REQ_IDS, None, NUM_SCHEDULED, {}, verify_as_chain=False) is None
    assert accept(step, logits, SimpleNamespace(all_greedy=True), 6) is None
    # ... and a later propose must not reorder its hidden states with that step's rows.
    hidden = torch.randn(24, 3)
    assert torch.equal(draft_context(step, hidden), hidden)


def test_a_proposal_is_only_verified_by_the_next_step():
    gen = torch.Generator().manual_seed(6)
    step, _, _ = make_step(gen)  # proposal handed over in step 1
    step.plan(REQ_IDS, None, NUM_SCHEDULED, {}, verify_as_chain=False)  # step 2: none
    plan = step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, {"r1": [1] * 6, "r2": [2] * 3,
                                                          "r3": [3] * 4}, False)
    # The step-1 trees are stale in step 3: every request verifies vLLM's tokens as chains.
    assert plan.tree.tokens[:, 0].tolist() == [1, 2, 3]
    assert plan.tree.parents[0].tolist() == [0, 1, 2, 3, 4, 5]


def test_a_step_where_no_request_drafted_runs_as_plain_decoding():
    # vLLM builds draft metadata for every step of a speculative engine, zero drafts too (a
    # paused adaptive step): such a step gets no plan, so no tree mask, depth positions or
    # tree sampler, and the proposal it did not schedule is dropped.
    gen = torch.Generator().manual_seed(8)
    step, _, moves = make_step(gen)  # proposal handed over in step 1
    decode = np.ones(len(REQ_IDS), dtype=np.int64)
    assert step.plan(REQ_IDS, [0] * len(REQ_IDS), decode, {}, verify_as_chain=False) is None
    positions = torch.arange(len(REQ_IDS))
    with step.target_forward(positions, lambda: None) as active:
        assert active is None and tree_context.plan_for(None) is None
    assert torch.equal(positions, torch.arange(len(REQ_IDS)))
    assert accept(step, torch.zeros(len(REQ_IDS), VOCAB), SimpleNamespace(all_greedy=True),
                       0) is None
    assert not moves
    # The step-1 trees are not verified by the step after either: it verifies vLLM's tokens.
    plan = step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, {"r1": [1] * 6, "r2": [2] * 3,
                                                          "r3": [3] * 4}, False)
    assert plan.tree.tokens[:, 0].tolist() == [1, 2, 3]


def test_batches_that_read_the_drafted_prefix_are_left_to_vllm():
    gen = torch.Generator().manual_seed(7)
    step, _, _ = make_step(gen)
    assert step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, True) is None
    positions = torch.arange(24)
    with step.target_forward(positions, lambda: None) as active:
        assert active is None and tree_context.plan_for(None) is None
    assert accept(step, torch.zeros(18, VOCAB), SimpleNamespace(all_greedy=True), 6) is None


def sampling_of(batch: int, seed: int) -> SimpleNamespace:
    temperature = torch.tensor([0.0, 0.8, 1.0, 0.5, 1.3])[:batch]
    return SimpleNamespace(all_greedy=False, temperature=temperature,
                           top_k=torch.tensor([5, 40, 3, 7, 40])[:batch],
                           top_p=torch.tensor([1.0, 0.9, 0.95, 1.0, 0.8])[:batch],
                           generators={2: torch.Generator().manual_seed(seed)})


def test_no_host_sync_in_a_tree_step():
    """Plan, target forward, acceptance (greedy and sampled), the KV move's pairs, the
    drafter's context and the tree build issue no operation that waits for a GPU."""
    gen = torch.Generator().manual_seed(8)
    head_gen = torch.Generator().manual_seed(9)
    from vllm_dartree.tree import DominoHead

    head = DominoHead.random(VOCAB, 16, 8, 8, generator=head_gen).with_input_gate_table()
    slot_mapping = torch.arange(24) + 50
    step, _, _ = make_step(gen)
    step.move_kv = lambda accepted, kv: compaction_pairs(accepted, slot_mapping)
    step.verifier.stats._last_log = float("inf")  # the periodic log line reads the sums
    logits = torch.randn(18, VOCAB, generator=gen)
    base_logits = torch.randn(5, 4, VOCAB, generator=gen)
    hidden = torch.randn(5, 4, 16, generator=gen)
    for sampling in (SimpleNamespace(all_greedy=True), sampling_of(5, 1)):
        with HostSyncCounter() as syncs:
            step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, False)
            with step.target_forward(torch.arange(24), lambda: None):
                pass
            accept(step, logits, sampling, max_spec_len=6)
            draft_context(step, torch.randn(24, 16))
            for variant in ("pruned", "fixed", "chain", "ddtree"):
                tree = build_tree(variant, base_logits, hidden, torch.arange(5), head,
                                  budget=BUDGET, top_k=8, width=3)
            step.hand_over(REQ_IDS, tree)
        assert syncs.calls == []


def test_no_host_sync_in_a_v2_tree_step():
    """The calls the V2 glue makes: plan, the plan's hand-over with the target layers' KV,
    depth positions into the persistent buffer, acceptance from a given target choice, the
    drafter context's row order, the tree build and hand-over: nothing waits for a GPU."""
    from vllm_dartree.step.verify_plan import write_depth_positions

    gen = torch.Generator().manual_seed(8)
    slot_mapping = torch.arange(24) + 50
    step, _, _ = make_step(gen)
    step.move_kv = lambda accepted, kv: compaction_pairs(accepted, slot_mapping)
    step.verifier.stats._last_log = float("inf")
    logits = torch.randn(18, VOCAB, generator=gen)
    buffer = torch.zeros(32, dtype=torch.int64)
    base_logits = torch.randn(5, 4, VOCAB, generator=gen)
    hidden = torch.randn(5, 4, 16, generator=gen)
    with HostSyncCounter() as syncs:
        step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, False)
        plan = step.verify_forward(kv_caches=lambda: "the layers")
        write_depth_positions(buffer, torch.arange(24), plan)
        step.accept_with(lambda plan: logits.argmax(dim=-1), columns=BUDGET + 1)
        torch.randn(24, 16)[step.accepted_order(24)]
        tree = build_tree("pruned", base_logits, hidden, torch.arange(5), None,
                          budget=BUDGET, top_k=8, width=3)
        step.hand_over(REQ_IDS, tree)
    assert plan is not None and syncs.calls == []


def test_the_sync_counter_sees_syncs():
    x = torch.arange(6)
    with HostSyncCounter() as syncs:
        x[x > 2].sum().item()
        x.repeat_interleave(x)
        bool(x[0])
    assert syncs.calls == ["__getitem__ with a boolean mask", "item",
                           "repeat_interleave with tensor repeats", "__bool__"]


def test_kv_compaction_sees_the_target_layers_only(monkeypatch):
    """The drafter's attention layers share the target's KV group but hold no tree: the
    KV move leaves them out."""
    import vllm.forward_context as forward_context

    from vllm_dartree.integration.v1.runner import target_kv_caches

    def layer(name):
        return SimpleNamespace(kv_cache=torch.full((2,), float(len(name))), isa="vec",
                               impl=object())

    names = ["model.layers.0.attn", "model.layers.1.attn", "draft.layers.0.attn"]
    context = SimpleNamespace(
        attn_metadata={n: SimpleNamespace(slot_mapping=torch.arange(3)) for n in names},
        no_compile_layers={n: layer(n) for n in names})
    monkeypatch.setattr(forward_context, "get_forward_context", lambda: context)
    runner = SimpleNamespace(drafter=SimpleNamespace(
        _draft_attn_layer_names={"draft.layers.0.attn"}))
    found = target_kv_caches(runner)
    assert [entry.kv_cache[0] for entry in found] == [float(len(n)) for n in names[:2]]


def test_target_layers_leave_out_drafter_and_recurrent_layers():
    """Both runners' KV collection (``kv_mover.target_layers_kv``): the drafter's layers,
    named or marked ``is_draft_layer``, and layers whose metadata has no slot mapping (a
    hybrid target's GDN layers) are left out; a per-virtual-engine list is unwrapped."""
    from vllm_dartree.step.kv_mover import target_layers_kv

    def layer(value, **marks):
        return SimpleNamespace(kv_cache=[torch.full((2,), value)], impl=object(), **marks)

    layers = {"t0": layer(1.0), "t1": layer(2.0), "named": layer(3.0),
              "marked": layer(4.0, is_draft_layer=True), "gdn": layer(5.0)}
    attention = SimpleNamespace(slot_mapping=torch.arange(3))
    metadata = {**{n: attention for n in ("t0", "t1", "named", "marked")},
                "gdn": SimpleNamespace(state_indices=torch.arange(3)), "gone": attention,
                "empty": None}
    found = target_layers_kv(metadata, layers, drafter_layers={"named"})
    assert [entry.kv_cache[0].item() for entry in found] == [1.0, 2.0]
    assert all(entry.isa == "" and entry.slot_mapping is attention.slot_mapping
               for entry in found)


def test_only_requests_whose_sampling_follows_the_chain_verify_as_chains():
    from vllm_dartree.step.verify_plan import chain_requests_on_v1, verifies_as_chain

    def params(**changes):
        plain = dict(presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                     bad_words=None, allowed_token_ids=None, logit_bias=None, min_tokens=0,
                     min_p=0.0, logprobs=None, structured_outputs=None)
        return SimpleNamespace(sampling_params=SimpleNamespace(**(plain | changes)))

    requests = {"a": params(), "b": params(logprobs=2), "c": SimpleNamespace(),
                "d": params(repetition_penalty=1.2), "e": params(min_tokens=3),
                "f": params(bad_words=["x y"]), "g": params(structured_outputs=object())}
    ids = ["a", "b", "c", "missing", "d", "e", "f", "g"]
    assert chain_requests_on_v1(requests, ids) == [
        False, False, False, False, False, False, True, True]
    # V1's tree verifier keeps raw logits rows only: processed logprobs take a chain there.
    assert chain_requests_on_v1(requests, ids, processed_logprobs=True) == [
        False, True, False, False, False, False, True, True]
    assert [verifies_as_chain(requests[r].sampling_params) for r in "abdefg"] == [
        False, False, False, False, True, True]


def test_a_chain_request_verifies_every_scheduled_row_as_a_chain_beside_trees():
    """r2's sampling reads its drafted prefix: its three scheduled rows become a chain over
    their tokens (each row's parent the row before), whatever the proposal held; r1 keeps
    its tree."""
    gen = torch.Generator().manual_seed(11)
    step, trees, _ = make_step(gen)
    chains = [False, False, True, False, False]
    plan = step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, False, chains)
    assert step.chain_rows == chains
    r1, r2 = plan.req_ids.index("r1"), plan.req_ids.index("r2")
    assert torch.equal(plan.tree.parents[r1], trees["r1"].parents[0])
    assert plan.tree.parents[r2, :3].tolist() == [0, 1, 2]
    assert plan.tree.depths[r2, :3].tolist() == [1, 2, 3]
    assert plan.tree.tokens[r2, :3].tolist() == trees["r2"].tokens[0, :3].tolist()
    assert plan.tree.valid[r2].tolist() == [True] * 3 + [False] * (BUDGET - 3)
    assert not plan.chains


def test_chain_proposals_make_chain_plans():
    """Chains (the chain variant, vLLM's own drafts) need no tree recompute in attention;
    a proposal of real trees does."""
    gen = torch.Generator().manual_seed(10)
    step, trees, _ = make_step(gen)  # a proposal of trees
    assert not step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, False).chains
    step.hand_over(["r1", "r2"], build_tree("chain", torch.randn(2, 4, VOCAB),
                                            None, torch.tensor([1, 2]), None, budget=BUDGET),
                   chains=True)
    assert step.plan(["r0", "r1", "r2"], [0, 4, 3], np.array([3, 5, 4]), {}, False).chains
    # No proposal at all: vLLM's scheduled tokens verify as chains.
    assert step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, False).chains


def test_path_tokens_are_each_rows_path_from_the_root():
    """Every logits row of a tree node holds the tokens from the root to that node (the
    node included, the root not), found here by walking parents; roots, requests without
    drafts and unused columns hold the padding. r2's tree is cut to its 3 scheduled rows."""
    from vllm_dartree.step.verify_plan import path_tokens

    gen = torch.Generator().manual_seed(5)
    step, _, _ = make_step(gen)
    plan = step.plan(REQ_IDS, NUM_DRAFTS, NUM_SCHEDULED, CHAIN_TOKENS, False)
    pad = VOCAB
    found = path_tokens(plan, pad)
    layout, _, num_logit_rows = naive_layout()
    assert found.shape == (num_logit_rows, BUDGET)
    expected = torch.full((num_logit_rows, BUDGET), pad)
    for t, req in enumerate(plan.req_ids):
        tokens, parents = plan.tree.tokens[t].tolist(), plan.tree.parents[t].tolist()
        for j, row in enumerate(layout[req][2][1:], start=1):
            path, node = [], j
            while node:
                path.append(tokens[node - 1])
                node = parents[node - 1]
            expected[row, : len(path)] = torch.tensor(sorted(path))
    assert torch.equal(found.sort(dim=1).values, expected)
    assert any((found[rows[2][1:]] != pad).sum(1).max() > 1 for rows in layout.values())
