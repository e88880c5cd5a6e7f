"""Whether to draft at all: the pause/probe policy as one state machine (:class:`PausePolicy`).

States (:class:`DraftingState`):

    PROBING         drafting; the next judged step starts the smoothed rate afresh
    DRAFTING        drafting; the steps judged since the last pause paid
    PAUSED          a back-off: ``left`` more steps without drafting
    SAMPLING_PLAIN  ``left`` more steps without drafting, to measure plain decoding

Transitions, named after their rule (``PausePolicy.fired`` counts them). Before each step
(:meth:`PausePolicy.should_draft`, R requests in the batch):

    "batch shrank"        PAUSED or SAMPLING_PLAIN -> drafting   R < R_stop, not vetoed at R,
                                                                 and the last tree pays at R
    "no tree could pay"   drafting -> PAUSED                     back-off < max_off_steps and
                                                                 no tree seen lately could pay
                                                                 at R, even without the margin
    "pause over"          PAUSED -> drafting                     its last step is skipped
    "plain sampled"       SAMPLING_PLAIN -> drafting             its last step is skipped

After a drafted step (:meth:`PausePolicy.start_up`, :meth:`PausePolicy.judge`):

    "start-up sample"     -> SAMPLING_PLAIN, 1 step              every START_UP_PLAIN_EVERY-th
                                                                 start-up step
    "approved"            -> DRAFTING, back-off = off_steps      rate >= REQUIRED_GAIN * R / T0
                                                                 and no measured verdict against
    "approved under veto" -> DRAFTING, back-off kept             the same, where the last
                                                                 measured verdict at R was against
    "plain sampling"         -> SAMPLING_PLAIN, PLAIN_SAMPLE_STEPS   approved, on a due step (every
                                                                 plain_every-th drafted step while
                                                                 plain decoding at R lacks samples)
    "not paying"          -> PAUSED                              rate < REQUIRED_GAIN * R / T0
    "vetoed"              -> PAUSED                              the measured verdict at R: drafted
                                                                 steps delivered less than plain

"drafting" is PROBING where no rate has been smoothed since the last pause, DRAFTING
otherwise. Every transition to PAUSED pauses for the back-off, doubles it (up to
``max_off_steps``) and records R_stop = R; the first step after a pause that drafts is a
single drafted probe. The judged rate is smoothed over the drafted steps since the last
pause, so one unlucky tree does not stop drafting:

    rate_1 = x_1        rate_k = rate_smoothing * rate_{k-1} + (1 - rate_smoothing) * x_k
    x = (R + g * (E(n*) - R)) / T(n*)        T0 = T(0, no drafting)

REQUIRED_GAIN's margin covers what the step-time model misses near a tie: a tree that only
matches plain decoding loses to it once its variance and probes are paid. A drafted probe
costs a drafter pass over the whole batch, so "no tree could pay" skips it (and stops
drafting, without a drafted step, when the batch grows to a size where trees cannot pay);
at the largest back-off probes run regardless, since the cost model may be wrong where it
extrapolates. While a veto holds at R, approval does not reset the back-off there, so each
veto doubles it; and a shrinking batch does not end a pause early at that size. The tests
the rules read (the measured veto, what recent trees would deliver) are asked lazily, in
the order the rules list them; :class:`~vllm_dartree.tree.adaptive.outlook.TreeOutlook`
computes the tree ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from enum import Enum

# A drafted step must promise this much more than plain decoding (tokens per ms).
REQUIRED_GAIN = 1.05
# Steps without drafting that measure plain decoding: the first verifies the last tree, the
# next ones are plain steps (MeasuredRates needs min_off of them).
PLAIN_SAMPLE_STEPS = 3
# During start-up, the step after every this many drafted steps does not draft.
START_UP_PLAIN_EVERY = 5

Test = Callable[[int], bool]  # a rule's test at a batch size


class DraftingState(Enum):
    PROBING = "probing"
    DRAFTING = "drafting"
    PAUSED = "paused"
    SAMPLING_PLAIN = "sampling plain"


class PausePolicy:
    """The state machine of the module docstring: its state, the steps ``left`` in a pause,
    the ``backoff`` (length of the next pause), ``stopped_at`` (R_stop) and the smoothed
    ``rate`` (None: PROBING's fresh start)."""

    rate_smoothing = 0.8

    def __init__(self, off_steps: int = 4, max_off_steps: int = 256) -> None:
        self.off_steps, self.max_off_steps = off_steps, max_off_steps
        self.state = DraftingState.PROBING
        self.left = 0
        self.backoff = off_steps
        self.stopped_at = 0
        self.rate: float | None = None
        self.fired: Counter[str] = Counter()

    def should_draft(self, requests: int, vetoed: Test, last_tree_pays: Test,
                     some_tree_could_pay: Test) -> bool:
        """Whether the step with ``requests`` in its batch drafts; every test is asked only
        where its rule needs it."""
        if (self.left and requests < self.stopped_at and not vetoed(requests)
                and last_tree_pays(requests)):
            self._resume("batch shrank")
        if (not self.left and self.backoff < self.max_off_steps
                and not some_tree_could_pay(requests)):
            self._pause("no tree could pay", requests)
        if not self.left:
            return True
        self.left -= 1
        if not self.left:
            self._resume("pause over" if self.state is DraftingState.PAUSED
                         else "plain sampled")
        return False

    def start_up(self, step: int) -> None:
        """The ``step``-th drafted step (from 1) was a start-up step: none is judged."""
        if step % START_UP_PLAIN_EVERY == 0:
            self._sample_plain("start-up sample", 1)

    def judge(self, requests: int, rate: float, plain_ms: float, verdict: bool | None,
              vetoed: bool, plain_due: bool) -> None:
        """A drafted step promised ``rate`` tokens per ms (x of the module docstring), plain
        decoding ``requests / plain_ms``; ``verdict``, ``vetoed``: the measured rates' at
        ``requests``; ``plain_due``: a plain sampling is due."""
        self.rate = rate if self.rate is None else (
            self.rate_smoothing * self.rate + (1 - self.rate_smoothing) * rate)
        if not (self.rate >= REQUIRED_GAIN * requests / plain_ms and verdict is not False):
            self._pause("vetoed" if verdict is False else "not paying", requests)
            return
        self.fired["approved under veto" if vetoed else "approved"] += 1
        if not vetoed:
            self.backoff = self.off_steps
        if not self.left:
            self.state = DraftingState.DRAFTING
        if plain_due:
            self._sample_plain("plain sampling", PLAIN_SAMPLE_STEPS)

    def _pause(self, rule: str, requests: int) -> None:
        self.fired[rule] += 1
        self.state = DraftingState.PAUSED
        self.left = self.backoff
        self.backoff = min(2 * self.backoff, self.max_off_steps)
        self.stopped_at = requests
        self.rate = None

    def _sample_plain(self, rule: str, steps: int) -> None:
        self.fired[rule] += 1
        self.state = DraftingState.SAMPLING_PLAIN
        self.left = steps

    def _resume(self, rule: str) -> None:
        self.fired[rule] += 1
        self.left = 0
        self.state = DraftingState.PROBING if self.rate is None else DraftingState.DRAFTING
