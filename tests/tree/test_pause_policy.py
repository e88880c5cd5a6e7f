"""The pause/probe state machine (tree/adaptive/pause.py) on its own: each transition, its
rule, and which tests a rule asks."""

from vllm_dartree.tree.adaptive import PLAIN_SAMPLE_STEPS, DraftingState, PausePolicy

PROBING, DRAFTING, PAUSED, SAMPLING_PLAIN = (DraftingState.PROBING, DraftingState.DRAFTING,
                                             DraftingState.PAUSED, DraftingState.SAMPLING_PLAIN)


class Answers:
    """The rules' tests at a batch size, answering fixed values and logging each question."""

    def __init__(self, vetoed=False, last_tree_pays=False, could_pay=True):
        self.answers = {"vetoed": vetoed, "last_tree_pays": last_tree_pays,
                        "some_tree_could_pay": could_pay}
        self.asked: list[str] = []

    def __getattr__(self, name):
        def test(requests: int) -> bool:
            self.asked.append(name)
            return self.answers[name]
        return test


def drafts(policy: PausePolicy, requests: int = 4, tests: Answers | None = None) -> bool:
    tests = tests or Answers()
    return policy.should_draft(requests, tests.vetoed, tests.last_tree_pays,
                               tests.some_tree_could_pay)


def judge(policy: PausePolicy, rate: float, requests: int = 4, plain_ms: float = 40.0,
          verdict=None, vetoed=False, plain_due=False) -> None:
    """Plain decoding delivers requests / plain_ms = 0.1 tokens/ms by default."""
    policy.judge(requests, rate, plain_ms, verdict, vetoed, plain_due)


def steps_until_drafting(policy: PausePolicy, requests: int = 4) -> int:
    skipped = 0
    while not drafts(policy, requests):
        skipped += 1
    return skipped


def test_a_step_that_does_not_pay_pauses_for_a_doubling_back_off():
    policy = PausePolicy(off_steps=2, max_off_steps=8)
    assert policy.state is PROBING and drafts(policy)
    paused = []
    for _ in range(4):
        judge(policy, rate=0.1)  # below 1.05 * 0.1: not paying
        assert policy.state is PAUSED and policy.rate is None
        paused.append(steps_until_drafting(policy))
        assert policy.state is PROBING  # the next drafted step is a probe
    assert paused == [2, 4, 8, 8]
    assert policy.fired == {"not paying": 4, "pause over": 4}


def test_an_approved_step_resets_the_back_off_unless_a_veto_holds():
    policy = PausePolicy(off_steps=2, max_off_steps=64)
    for _ in range(3):
        judge(policy, rate=0.1)
        steps_until_drafting(policy)
    assert policy.backoff == 16
    judge(policy, rate=0.2, vetoed=True)
    assert policy.state is DRAFTING and policy.backoff == 16
    judge(policy, rate=0.2)
    assert policy.backoff == 2
    assert policy.fired["approved under veto"] == 1 and policy.fired["approved"] == 1


def test_the_rate_is_smoothed_since_the_last_pause():
    policy = PausePolicy()
    judge(policy, rate=0.2)
    judge(policy, rate=0.1)  # 0.8 * 0.2 + 0.2 * 0.1 = 0.18: still pays
    assert policy.state is DRAFTING and abs(policy.rate - 0.18) < 1e-12
    judge(policy, rate=0.1, verdict=False)  # measured: drafting delivered less
    assert policy.state is PAUSED and policy.fired["vetoed"] == 1


def test_plain_probes_and_start_up_samples_keep_the_rate():
    policy = PausePolicy()
    policy.start_up(4)
    assert policy.state is PROBING  # only every fifth start-up step is followed by one
    policy.start_up(5)
    assert policy.state is SAMPLING_PLAIN and steps_until_drafting(policy) == 1
    assert policy.state is PROBING
    judge(policy, rate=0.2, plain_due=True)
    assert policy.state is SAMPLING_PLAIN
    assert steps_until_drafting(policy) == PLAIN_SAMPLE_STEPS
    assert policy.state is DRAFTING and policy.rate == 0.2
    assert policy.fired == {"start-up sample": 1, "plain sampled": 2, "approved": 1,
                            "plain sampling": 1}


def test_a_pause_ends_early_only_where_the_batch_shrank_and_the_last_tree_pays():
    policy = PausePolicy(off_steps=4)
    judge(policy, rate=0.1, requests=8)
    larger = Answers(last_tree_pays=True)
    assert not drafts(policy, 8, larger) and larger.asked == []  # not smaller: not asked
    held = Answers(vetoed=True, last_tree_pays=True)
    assert not drafts(policy, 2, held) and held.asked == ["vetoed"]
    costly = Answers(last_tree_pays=False)
    assert not drafts(policy, 2, costly) and costly.asked == ["vetoed", "last_tree_pays"]
    paying = Answers(last_tree_pays=True)
    assert drafts(policy, 2, paying)
    assert paying.asked == ["vetoed", "last_tree_pays", "some_tree_could_pay"]
    assert policy.state is PROBING and policy.fired["batch shrank"] == 1


def test_no_drafted_probe_where_no_tree_could_pay_until_the_largest_back_off():
    policy = PausePolicy(off_steps=2, max_off_steps=8)
    hopeless = Answers(could_pay=False)
    skipped = 0
    while not drafts(policy, 4, hopeless):
        skipped += 1
    assert skipped == 2 + 4  # two pauses chained without a drafted step
    assert policy.backoff == 8 and policy.fired["no tree could pay"] == 2
    hopeless.asked.clear()
    judge(policy, rate=0.1)
    steps_until_drafting(policy)
    assert drafts(policy, 4, hopeless) and hopeless.asked == []  # at the largest: probes run
