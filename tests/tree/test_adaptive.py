"""Adaptive verification (tree/adaptive/): acceptance, priority order, the allocation on
hand-made cost curves and probabilities, the cost fit and the calibration arithmetic."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_dartree.tree import DominoHead, DraftTree, build_tree, truncate
from vllm_dartree.tree.adaptive import (
    AdaptiveVerification,
    AutoWidth,
    DepthCalibration,
    LinearCost,
    MeasuredRates,
    StepCostModel,
    best_node_count,
    counts_of_top,
    depth_leaders,
    node_acceptance,
    priority_order,
    with_confidence,
)

SETTINGS = settings(max_examples=30, deadline=None)


def hand_tree(paths: list[tuple[int, float]], budget: int | None = None) -> DraftTree:
    """One request: node j+1 = (parent, path probability); padded to ``budget``."""
    budget = budget or len(paths)
    parents, depths, scores = [], [], []
    for parent, prob in paths:
        parents.append(parent)
        depths.append(1 if parent == 0 else depths[parent - 1] + 1)
        scores.append(math.log(prob))
    pad = budget - len(paths)
    return DraftTree(
        tokens=torch.arange(budget).view(1, -1),
        parents=torch.tensor([parents + [0] * pad]),
        depths=torch.tensor([depths + [1] * pad]),
        num_nodes=torch.tensor([len(paths)]),
        valid=torch.tensor([[True] * len(paths) + [False] * pad]),
        scores=torch.tensor([scores + [0.0] * pad]),
        max_depth=max(depths),
    )


def random_trees(seed: int, requests: int = 3, budget: int = 12) -> DraftTree:
    gen = torch.Generator().manual_seed(seed)
    vocab, depths, hidden = 20, 5, 8
    head = DominoHead.random(vocab, hidden, 6, 4, generator=gen, scale=2.0)
    return build_tree("pruned", torch.randn(requests, depths, vocab, generator=gen) * 2,
                      torch.randn(requests, depths, hidden, generator=gen),
                      torch.randint(0, vocab, (requests,), generator=gen), head,
                      budget=budget, top_k=4, width=3, depth_bonus=-0.2)


def is_subtree_prefix(tree: DraftTree, count: int, row: int = 0) -> bool:
    """Columns 0..count-1 of ``row`` are valid and each node's parent is among them."""
    parents = tree.parents[row, :count].tolist()
    valid = tree.valid[row, :count].tolist()
    return all(valid) and all(p <= j for j, p in enumerate(parents))  # parent index < j + 1


# ---------------------------------------------------------------- node acceptance
def test_acceptance_is_the_path_probability_times_the_depth_scale():
    tree = hand_tree([(0, 0.9), (1, 0.45), (0, 0.3)])
    ones = torch.ones(4)
    assert node_acceptance(tree, ones)[0].tolist() == pytest.approx([0.9, 0.45, 0.3])
    halves = torch.tensor([1.0, 1.0, 0.5, 1.0])
    assert node_acceptance(tree, halves)[0].tolist() == pytest.approx([0.9, 0.225, 0.3])


def test_acceptance_never_grows_along_a_path_and_padding_is_zero():
    tree = hand_tree([(0, 0.5), (1, 0.4)], budget=4)
    boost_depth_two = torch.tensor([1.0, 1.0, 4.0])  # 0.4 * 4 = 1.6 -> capped by the parent
    assert node_acceptance(tree, boost_depth_two)[0].tolist() == pytest.approx(
        [0.5, 0.5, 0.0, 0.0])


@SETTINGS
@given(st.integers(0, 10_000))
def test_every_prefix_of_the_priority_order_is_a_subtree(seed):
    tree = random_trees(seed)
    scale = torch.rand(tree.depth_limit + 1, generator=torch.Generator().manual_seed(seed)) * 2
    ordered, acceptance = priority_order(tree, node_acceptance(tree, scale))
    for row in range(tree.num_requests):
        real = int(ordered.num_nodes[row])
        assert all(is_subtree_prefix(ordered, n, row) for n in range(real + 1))
        assert acceptance[row, :real].diff().le(0).all()  # best first
    # The same set of (token path) nodes: reordering loses and invents nothing.
    assert sorted(ordered.scores[ordered.valid].tolist()) == pytest.approx(
        sorted(tree.scores[tree.valid].tolist()))


def test_a_truncated_priority_order_keeps_the_most_likely_nodes():
    tree = hand_tree([(0, 0.2), (0, 0.7), (2, 0.6), (3, 0.1)])
    ordered, _ = priority_order(tree, node_acceptance(tree, torch.ones(5)))
    kept = truncate(ordered, torch.tensor([2]))
    assert kept.scores[kept.valid].exp().tolist() == pytest.approx([0.7, 0.6])
    assert kept.parents[0, :2].tolist() == [0, 1]


# ------------------------------------------------------------------ allocation
ACCEPTANCE = torch.tensor([[0.9, 0.5], [0.2, 0.0]])  # two requests, two nodes each


def test_cheap_rows_buy_nodes_until_they_stop_paying():
    # E(n) = 2, 2.9, 3.4, 3.6, 3.6; T(n) = 10 + n: ratios .200 .264 .283 .277 .257
    step_ms = 10 + torch.arange(5, dtype=torch.float32)
    assert int(best_node_count(ACCEPTANCE, step_ms)) == 2


def test_expensive_rows_choose_no_tree():
    step_ms = 10 + 10 * torch.arange(5, dtype=torch.float32)  # ratio .2 .145 ...
    assert int(best_node_count(ACCEPTANCE, step_ms)) == 0


def test_free_rows_verify_every_node_that_can_be_accepted():
    step_ms = torch.full((5,), 10.0)
    assert int(best_node_count(ACCEPTANCE, step_ms)) == 3  # the zero node adds nothing


def test_counts_split_the_global_top_n_by_request():
    assert counts_of_top(ACCEPTANCE, torch.tensor(0)).tolist() == [0, 0]
    assert counts_of_top(ACCEPTANCE, torch.tensor(2)).tolist() == [2, 0]
    assert counts_of_top(ACCEPTANCE, torch.tensor(3)).tolist() == [2, 1]
    ties = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    assert counts_of_top(ties, torch.tensor(3)).tolist() == [2, 1]  # lower request first
    valid = torch.tensor([[True, True], [True, False]])
    assert counts_of_top(ACCEPTANCE, torch.tensor(4), valid).tolist() == [2, 1]


# ------------------------------------------------------------------ cost model
def test_the_cost_fit_recovers_a_linear_step_time():
    model = LinearCost(("step", "request", "row"), decay=1.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        requests = int(torch.randint(1, 17, (1,), generator=gen))
        rows = requests + int(torch.randint(0, 100, (1,), generator=gen))
        assert model.observe(5.0 + 2.0 * requests + 0.5 * rows, 1.0, requests, rows)
    assert model.coefficients.tolist() == pytest.approx([5.0, 2.0, 0.5], abs=0.05)
    assert model.predict(1.0, 4, 20) == pytest.approx(23.0, abs=0.1)


def test_an_idle_gap_is_not_taken_for_cost():
    model = LinearCost(("step", "row"), warmup=4)
    for rows in (1, 10, 20, 30, 40):
        model.observe(10.0 + rows, 1.0, rows)
    before = model.coefficients.copy()
    assert not model.observe(5000.0, 1.0, 10)  # the engine waited for a request
    assert (model.coefficients == before).all()


def test_an_idle_gap_before_warmup_is_not_taken_for_cost():
    """A server's warm-up request, then the first real one minutes later: the step that
    spans the wait is skipped although the fit has too few samples to predict it."""
    model = LinearCost(("step", "row"), warmup=8)
    assert model.observe(50.0, 1.0, 1)
    assert not model.observe(101_000.0, 1.0, 7)
    assert model.observe(400.0, 1.0, 80)  # a prefill: large, but not ten times the largest
    assert model.observed == 2


def test_the_fit_is_solved_when_read_and_screened_against_a_recent_solve(monkeypatch):
    """Observing alone (a pause in drafting) solves once per ``screen_lag`` samples, for the
    outlier screen; reading the coefficients solves whatever was added since."""
    from vllm_dartree.tree.adaptive import cost as cost_module

    solves = []
    solve = cost_module.nonnegative_least_squares
    monkeypatch.setattr(cost_module, "nonnegative_least_squares",
                        lambda *args: solves.append(1) or solve(*args))
    model = LinearCost(("step", "row"), warmup=4, screen_lag=16)
    for i in range(64):
        rows = 1 + i % 7
        assert model.observe(10.0 + 2.0 * rows, 1.0, rows)
    assert 1 <= len(solves) <= 64 // 16 + 1
    assert model.coefficients.tolist() == pytest.approx([10.0, 2.0], abs=0.05)
    assert not model.observe(5000.0, 1.0, 3)  # screened against the fit just read


def test_a_barely_varying_batch_size_does_not_buy_a_huge_intercept():
    """Requests fixed at 16 for long, then a few finish: an unconstrained fit answers with a
    large intercept and a negative per-request cost; the non-negative fit keeps predicting."""
    model = LinearCost(("step", "request", "row"))
    for i in range(60):
        rows = 16 + (i * 5) % 40
        model.observe(50.0 + 1.7 * rows, 1.0, 16, rows)
    for requests in (15, 14, 13, 12):
        model.observe(50.0 + 1.7 * (requests + 10), 1.0, requests, requests + 10)
    assert (model.coefficients >= 0).all()
    assert model.predict(1.0, 12, 22) == pytest.approx(50.0 + 1.7 * 22, rel=0.05)
    assert model.coefficients[2] == pytest.approx(1.7, rel=0.05)


def test_the_step_model_splits_target_and_drafter_time():
    """Every step drafts for the same 2 requests: the drafter's part is timed, so a step
    without drafting is still predicted right (the target's part alone), and a tree step's
    fixed cost (8 ms) is told apart from its rows."""
    model = StepCostModel()
    for i in range(40):
        nodes = (i * 3) % 30
        draft_ms = 15.0 + 5.0 * 2
        ms = 20.0 + 1.5 * (2 + nodes) + 8.0 * (nodes > 0) + draft_ms
        model.observe(2, 2 + nodes, nodes, ms, True, draft_ms)
    model.observe(2, 2, 0, 20.0 + 3.0 + 2.0, False, 2.0)
    assert float(model.predict(2, 0, drafting=False)) == pytest.approx(25.0, rel=0.05)
    assert float(model.predict(2, 10)) == pytest.approx(20 + 18 + 8 + 25, rel=0.05)


# ----------------------------------------------------------------- calibration
def test_calibration_moves_each_depth_toward_observed_over_predicted():
    calibration = DepthCalibration(max_depth=2, device=torch.device("cpu"), decay=1.0,
                                   pseudo=1.0)
    chain = hand_tree([(0, 0.5), (1, 0.25)])
    for _ in range(3):  # every step accepts depth 1, never depth 2
        calibration.update(chain, torch.tensor([2]))
    # c[d] = (observed + pseudo * 1) / (predicted + pseudo)
    assert calibration.scale().tolist() == pytest.approx(
        [1.0, (3 + 1) / (1.5 + 1), (0 + 1) / (0.75 + 1)])
    assert calibration.raw_error() == pytest.approx(0.5)  # depth 1: |1.5 - 3| / 3
    assert calibration.error() < calibration.raw_error()


def test_calibration_counts_only_verified_nodes():
    calibration = DepthCalibration(max_depth=2, device=torch.device("cpu"), decay=1.0)
    tree = truncate(hand_tree([(0, 0.5), (1, 0.25)]), torch.tensor([1]))
    calibration.update(tree, torch.tensor([1]))
    assert calibration.predicted.tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert calibration.observed.tolist() == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------------- policy
def trained_policy(ms_per_row: float, steps: int = 40) -> AdaptiveVerification:
    policy = AdaptiveVerification(max_depth=5, device=torch.device("cpu"), start_up_steps=0,
                            excursion_every=0)
    for i in range(steps):
        rows = 3 + (i * 7) % 36
        draft_ms = 5.0 * 3
        policy.record_drafting(True, draft_ms)
        policy.observe_step(3, rows, rows - 3, 20.0 + draft_ms + ms_per_row * rows)
    return policy


def test_the_policy_verifies_everything_when_rows_are_free():
    tree = random_trees(1)
    choice = trained_policy(ms_per_row=0.0).choose(tree)
    assert choice.counts == tree.num_nodes.tolist()
    for row, count in enumerate(choice.counts):
        assert is_subtree_prefix(choice.tree, count, row)


def test_the_policy_chooses_no_tree_when_rows_cost_a_whole_step():
    choice = trained_policy(ms_per_row=30.0).choose(random_trees(2))
    assert choice.counts == [0, 0, 0]
    assert choice.expected_tokens == pytest.approx(3.0)


def test_the_policy_probes_sizes_at_start_and_never_counts_padding():
    policy = AdaptiveVerification(max_depth=3, device=torch.device("cpu"), start_up_steps=2)
    tree = hand_tree([(0, 0.9), (1, 0.45), (0, 0.3)], budget=6)
    first, second = policy.choose(tree), policy.choose(tree)
    assert first.counts == [3]  # everything real, none of the 3 padding columns
    assert second.counts == [0]


def costly_drafting_policy(steps: int = 40) -> AdaptiveVerification:
    """Drafting costs 10 ms per request and a row 30 ms: a drafted step's best tree (about
    5.7 tokens in 290 ms) loses to plain decoding (3 tokens in 110 ms)."""
    policy = AdaptiveVerification(max_depth=5, device=torch.device("cpu"), start_up_steps=0,
                            excursion_every=0, off_steps=2, max_off_steps=8)
    for i in range(steps):
        rows, drafted = 3 + (i * 7) % 36, i % 3 != 0
        draft_ms = 10.0 * 3 if drafted else 1.0
        policy.record_drafting(drafted, draft_ms)
        policy.observe_step(3, rows, rows - 3, 20.0 + draft_ms + 30.0 * rows)
    return policy


def pauses_after_drafted_steps(policy: AdaptiveVerification, tree: DraftTree, rounds: int,
                               after_choice=lambda: None) -> list[int]:
    """``rounds`` times: a drafted step choosing from ``tree`` at 3 requests, then the
    number of steps that do not draft before the next drafted probe."""
    pauses = []
    assert policy.should_draft(3)
    for _ in range(rounds):
        policy.choose(tree)
        after_choice()
        skipped = 0
        while not policy.should_draft(3):  # the first True is the next drafted probe
            skipped += 1
        pauses.append(skipped)
    return pauses


def test_drafting_backs_off_while_no_tree_pays_and_probes_in_between():
    """No tree seen could pay at 3 requests either, so the pauses chain without a drafted
    probe (2 + 4 steps) until the back-off reaches its maximum; from then on every 8th step
    probes, in case the cost model is wrong."""
    assert pauses_after_drafted_steps(costly_drafting_policy(), random_trees(4), 4) == [
        6, 8, 8, 8]


def test_a_young_cost_model_cannot_rule_probes_out():
    """Fewer tree steps seen than ``trusted_after``: every pause ends with a drafted probe
    (2, 4, 8 steps apart), whatever the fit predicts, so the fit gets the samples that
    correct it."""
    policy = costly_drafting_policy(steps=20)
    assert policy.cost.tree_steps < policy.trusted_after
    assert pauses_after_drafted_steps(policy, random_trees(4), 3) == [2, 4, 8]


def test_a_young_cost_model_verifies_a_quarter_of_the_nodes_where_it_would_verify_none():
    """Rows cost a whole step (the trained fit chooses no node), but with 20 tree steps
    seen the policy verifies a quarter of R*B = 36 nodes: the steps that test its fit."""
    young = trained_policy(ms_per_row=30.0, steps=20)
    assert young.cost.tree_steps < young.trusted_after
    assert sum(young.choose(random_trees(2)).counts) == 9
    assert trained_policy(ms_per_row=30.0).choose(random_trees(2)).counts == [0, 0, 0]


def test_a_pause_ends_with_a_drafted_probe_where_the_trees_seen_could_pay():
    """The same back-off where a tree could pay (as if the drafted steps had promised every
    node, up to 3 tokens per request): each pause ends with a drafted probe, 2, 4, 8 steps
    apart."""
    policy = costly_drafting_policy()

    def trees_promised_every_node():
        policy.outlook.recent_curves.clear()
        policy.outlook.recent_curves.append(np.minimum(np.arange(1.0, 13.0), 3.0))

    assert pauses_after_drafted_steps(policy, random_trees(4), 3,
                                      trees_promised_every_node) == [2, 4, 8]


def test_a_probe_is_judged_by_the_trees_seen_on_average():
    """One easy step whose tree promised every node among 63 that promised 0.1 per node:
    the average does not pay, so the pause goes on without a drafted probe."""
    policy = step_cost_policy(ms_per_step=40.0)
    policy.outlook.recent_curves.append(np.minimum(np.arange(1.0, 13.0), 3.0))
    assert policy.should_draft(4)
    policy.outlook.recent_curves.extend([np.minimum(0.1 * np.arange(1.0, 13.0), 3.0)] * 63)
    assert not policy.should_draft(4)


def test_a_growing_batch_stops_drafting_without_a_drafted_step_where_no_tree_pays():
    policy = step_cost_policy(ms_per_step=40.0)
    policy.choose(random_trees(4, requests=1))  # one request: the tree pays
    assert policy.should_draft(1)
    assert not policy.should_draft(4)  # four: not even the best tree seen would pay
    assert not policy.should_draft(4)
    assert policy.should_draft(1)  # back to one: a pause ends early where trees pay


def step_cost_policy(ms_per_step: float) -> AdaptiveVerification:
    """Like :func:`costly_drafting_policy` with a fixed ``ms_per_step`` on top: the larger it
    is, the more a tree's extra tokens per step are worth."""
    policy = AdaptiveVerification(max_depth=5, device=torch.device("cpu"), start_up_steps=0,
                            excursion_every=0, off_steps=2, max_off_steps=8)
    for i in range(60):
        requests = 1 + i % 3
        drafted, nodes = i % 4 != 0, (i * 5) % (4 * requests)
        draft_ms = 10.0 * requests if drafted else 1.0
        policy.record_drafting(drafted, draft_ms)
        policy.observe_step(requests, requests + nodes, nodes,
                            ms_per_step + draft_ms + 30.0 * (requests + nodes))
    return policy


def test_nodes_that_promise_less_than_a_token_each_cannot_pay_where_sure_ones_would():
    """Four requests, rows at 30 ms, drafting at 10 ms per request: k nodes per request pay
    (without the margin) once they deliver 0.24 + 0.75 k tokens. The trees seen promised
    either every node (up to 3 tokens per request) or 0.6 tokens per node: only the first
    lets a probe run."""
    for per_node, drafts in ((1.0, True), (0.6, False)):
        policy = step_cost_policy(ms_per_step=40.0)
        policy.outlook.recent_curves.append(np.minimum(per_node * np.arange(1.0, 13.0), 3.0))
        assert policy.should_draft(4) is drafts


def test_a_pause_ends_early_when_the_batch_shrinks_to_where_trees_pay():
    policy = step_cost_policy(ms_per_step=40.0)
    policy.choose(random_trees(4, requests=3))  # 3 requests: the tree does not pay
    assert not policy.should_draft(3)
    assert not policy.should_draft(4)  # more requests: trees pay even less
    assert policy.should_draft(1)  # one request: the step's fixed cost dominates


def test_a_pause_stays_when_the_smaller_batch_still_does_not_pay():
    policy = costly_drafting_policy()
    policy.choose(random_trees(4))
    assert not policy.should_draft(2)
    assert not policy.should_draft(1)


def test_delivered_over_promised_tokens_scale_the_promise():
    """g = (delivered + 2) / (promised + 2) over the verified choices (decay 0.95)."""
    policy, tree = trained_policy(ms_per_row=0.0), random_trees(5)
    first = policy.choose(tree)
    assert policy.gain_scale == 1.0  # nothing verified yet
    promised = first.expected_tokens - 3
    # Every request accepted one node more than the root: 3 tokens beyond R delivered.
    policy.observe_acceptance(first.tree, torch.tensor([2, 2, 2]))
    second = policy.choose(tree)
    assert policy.gain_scale == pytest.approx((3 + 2) / (promised + 2), rel=1e-5)
    policy.observe_acceptance(second.tree, torch.tensor([1, 1, 1]))  # nothing accepted
    policy.choose(tree)
    promised_sum = 0.95 * promised + (second.expected_tokens - 3)
    assert policy.gain_scale == pytest.approx((0.95 * 3 + 2) / (promised_sum + 2), rel=1e-5)


def test_drafting_stays_on_when_trees_pay():
    policy, tree = trained_policy(ms_per_row=0.0), random_trees(5)
    for _ in range(5):
        assert policy.should_draft(5)
        policy.choose(tree)


def test_measured_rates_need_both_kinds_of_step_before_a_verdict():
    rates = MeasuredRates(decay=0.5, min_on=2, min_off=1)
    rates.observe(True, 4, tokens=8.0, ms=100.0)
    assert rates.rate(True, 4) is None and rates.verdict(4) is None  # one drafted sample
    rates.observe(True, 4, tokens=12.0, ms=100.0)
    assert rates.rate(True, 4) == pytest.approx((0.5 * 8 + 12) / (0.5 * 100 + 100))
    assert rates.verdict(4) is None  # no plain step yet
    rates.observe(False, 4, tokens=4.0, ms=40.0)
    assert rates.verdict(4) is True  # 0.107 tokens/ms drafting against 0.1 plain
    assert not rates.vetoed(4)
    assert rates.verdict(2) is None  # another batch size: nothing measured
    rates.observe(False, 4, tokens=4.0, ms=20.0)  # plain got faster: 6 tokens in 40 ms
    assert rates.verdict(4) is False
    rates.forget_drafting(4)
    assert rates.verdict(4) is None and rates.rate(False, 4) is not None
    assert rates.vetoed(4) and not rates.vetoed(2)  # the verdict outlives the drafted sums


def test_steps_are_sorted_into_drafting_plain_and_neither():
    """Steady drafting: drafted after a drafted step (tokens = R + accepted nodes). Plain:
    no node verified and no drafting. A step that prefilled, or the first after a pause,
    is neither."""
    policy, tree = AdaptiveVerification(max_depth=5, device=torch.device("cpu")), random_trees(5)

    def step(drafted: bool, rows: int, nodes: int, ms: float, accepted: list[int] | None):
        policy.record_drafting(drafted, 1.0)
        if accepted is not None:
            policy.observe_acceptance(tree, torch.tensor(accepted))
        policy.observe_step(3, rows, nodes, ms)

    step(True, 3, 0, 50.0, None)  # first drafted step: the one before did not draft
    step(True, 9, 6, 60.0, [3, 1, 2])  # steady: 3 + 3 tokens
    step(True, 40, 6, 300.0, [2, 2, 2])  # a prefill rode along: left out
    step(False, 9, 6, 30.0, [1, 1, 1])  # verified a tree, no drafting: neither
    step(False, 3, 0, 20.0, None)  # plain
    sums = policy.measured._sums
    assert sums[(True, 3)] == [6.0, 60.0, 1]
    assert sums[(False, 3)] == [3.0, 20.0, 1]


def test_measured_rates_stop_drafting_that_the_model_says_pays():
    policy, tree = trained_policy(ms_per_row=0.0), random_trees(5)
    policy.choose(tree)
    assert policy.should_draft(3)  # the model alone: trees pay
    for _ in range(policy.measured.min_on):
        policy.measured.observe(True, 3, tokens=3.5, ms=40.0)
    for _ in range(policy.measured.min_off):
        policy.measured.observe(False, 3, tokens=3.0, ms=25.0)
    policy.choose(tree)  # measured: 0.0875 tokens/ms drafting, 0.12 plain
    assert not policy.should_draft(3)
    assert policy.measured.rate(True, 3) is None  # measured afresh after the pause


def test_a_step_spanning_an_idle_gap_is_not_a_measured_rate():
    policy = trained_policy(ms_per_row=0.0)
    policy.record_drafting(False, 1.0)
    assert not policy.observe_step(3, 3, 0, 60_000.0)  # plain, then the engine idled
    assert (False, 3) not in policy.measured._sums


def test_a_veto_keeps_the_back_off_growing_until_drafting_measures_paying():
    """The model says trees pay at 3 requests, the measured rates say they do not: each
    veto pauses drafting for twice as long as the one before (4, 8, 16 steps), although
    the model approves every drafted step in between; once drafting measures paying, the
    model's approval resets the back-off."""
    policy, tree = trained_policy(ms_per_row=0.0), random_trees(5)
    policy.pause.max_off_steps = 64

    def veto(on_ms: float) -> int:
        for _ in range(policy.measured.min_on):
            policy.measured.observe(True, 3, tokens=3.5, ms=on_ms)
        for _ in range(policy.measured.min_off):
            policy.measured.observe(False, 3, tokens=3.0, ms=25.0)
        policy.choose(tree)
        skipped = 0
        while not policy.should_draft(3):
            skipped += 1
        policy.choose(tree)  # the probe: the model approves, nothing measured yet
        assert policy.should_draft(3)
        return skipped

    assert [veto(on_ms=40.0) for _ in range(3)] == [4, 8, 16]
    veto(on_ms=20.0)  # measured: 0.175 tokens/ms drafting against 0.12 plain
    assert policy.pause.backoff == policy.pause.off_steps


def test_drafting_pauses_to_measure_plain_steps():
    policy, tree = trained_policy(ms_per_row=0.0), random_trees(5)
    policy.plain_every = 4
    paused = []
    for _ in range(8):
        policy.choose(tree)
        skipped = 0
        while not policy.should_draft(3):
            skipped += 1
        paused.append(skipped)
    assert paused == [0, 0, 0, 3, 0, 0, 0, 3]  # every 4th drafted step: 3 without drafting


# ----------------------------------------------------------------- confidence head
def test_a_confidence_head_moves_each_depth_to_its_chain_survival():
    """Depth 1: best node 0.8 (chain), sibling 0.1; depth 2: chain child 0.4. With survival
    0.5 then 0.5 the chain nodes carry 0.5 and 0.25, the sibling keeps its 1/8 ratio."""
    tree = hand_tree([(0, 0.8), (0, 0.1), (1, 0.4)], budget=4)
    tokens, best = depth_leaders(tree, 2)
    assert tokens[0].tolist() == [0, 2] and best[0].exp().tolist() == pytest.approx([0.8, 0.4])
    moved = with_confidence(tree, torch.tensor([[0.5, 0.5]]))
    assert moved.scores[0, :3].exp().tolist() == pytest.approx([0.5, 0.0625, 0.25])
    assert moved.scores[0, 3] == tree.scores[0, 3]  # padding untouched
    assert torch.equal(moved.tokens, tree.tokens) and torch.equal(moved.parents, tree.parents)


def test_the_auto_width_follows_the_largest_recent_count_within_its_bounds():
    width = AutoWidth(max_width=12, budget=64, num_depths=16, window=1)
    assert width.widths == [4, 8, 12]  # ceil(64 / 16) keeps W * D >= B; powers of two
    assert width.width == 12  # before any choice
    assert width.update([0, 7, 2]) == 8  # rounded up: still >= the largest count
    assert width.update([1, 0]) == 4
    assert width.update([30, 64]) == 12
    assert width.update([]) == 12  # a step without drafts leaves the width as it was
    assert width.update([0, 0]) == 12  # so does one that verified no node
    cpu = AutoWidth(max_width=4, budget=6, num_depths=6, window=1)
    assert cpu.widths == [1, 2, 4]
    assert [cpu.update([n]) for n in (1, 2, 3, 5, 0)] == [1, 2, 4, 4, 4]
    assert AutoWidth(max_width=2, budget=64, num_depths=4).widths == [2]  # max caps min
    windowed = AutoWidth(max_width=4, budget=6, num_depths=6, window=3)
    assert [windowed.update([n]) for n in (6, 1, 0, 1, 2, 1)] == [4, 4, 4, 4, 2, 2]


def test_the_budget_hands_the_scheduled_counts_to_its_auto_width():
    auto = AutoWidth(max_width=6, budget=24, num_depths=8, window=1)
    policy = AdaptiveVerification(8, torch.device("cpu"), auto_width=auto)
    policy.observe_scheduled([4, 2, 0])
    assert (auto.widths, auto.width) == ([3, 4, 6], 4)
    policy.observe_scheduled([1])
    assert auto.width == 3
    AdaptiveVerification(8, torch.device("cpu")).observe_scheduled([5])  # no auto width: no-op


def test_a_narrower_width_keeps_the_nodes_a_smaller_budget_would_pick():
    """What AutoWidth relies on: the n best nodes (by path score) of a pruned tree built with
    width n are those of the tree built with the full width, for every n up to it."""
    gen = torch.Generator().manual_seed(0)
    vocab, depths, hidden = 40, 5, 8
    head = DominoHead.random(vocab, hidden, 6, 4, generator=gen, scale=2.0)
    logits = torch.randn(2, depths, vocab, generator=gen) * 2
    states = torch.randn(2, depths, hidden, generator=gen)
    roots = torch.randint(0, vocab, (2,), generator=gen)

    def best_paths(width: int, n: int, row: int) -> set[tuple[int, ...]]:
        tree = build_tree("pruned", logits, states, roots, head, budget=12, top_k=6,
                          width=width, depth_bonus=0.0)
        scores = torch.where(tree.valid[row], tree.scores[row], float("-inf"))
        paths = set()
        for node in scores.argsort(descending=True)[:n].tolist():
            path, at = [], node + 1  # parents: 0 is the root, k the node in column k - 1
            while at:
                path.append(int(tree.tokens[row, at - 1]))
                at = int(tree.parents[row, at - 1])
            paths.add(tuple(reversed(path)))
        return paths

    for n in range(1, 7):
        for row in range(2):
            assert best_paths(n, n, row) == best_paths(6, n, row), (n, row)
