"""Where each live call's engine steps fall in the chunk's cycle, so that calls take turns.

A call fed at real time (a microphone) has its engine steps at its audio's pace: one a
`period` (a steady step's frames over the frame rate), each as soon as the audio it needs
has arrived. Two calls whose steps come due together wait for each other's every time, and
each must be planned on the step of both: FlashHead Pro on the H200, 1.06 s instead of
0.46 s, and two calls' speech-to-lips p95 at 2.12 s where one alone had 1.62 s
(bench/RESULTS.md, issue 30). Due half a period apart, each call's step runs while the
other waits for its audio, and each can be planned on a step of its own.

A call moves its steps by the silence on its timeline (`realtime.playout`): a joining call
by the pre-roll it starts with (less of it: its first frame later, once), a call whose delay
grows by how much silence it inserts (more: every later answer later). Both come in whole
`INSERT_STEP`s, so a call is placed within half of one (80 ms) of where it aims.
`choose` picks the option where the others wait least, then the call itself, then the
cheapest; `StepCycle` knows the engine's calls, places the one that joins or grows, and
re-plans the others on what they will wait.

Only calls fed at real time take a place. An agent pushing its answer faster than real
time runs its steps back to back, and a call beside it can be planned only on the step
they share (as every call was before this module): `StepCycle` then re-plans them all so.

A growth that keeps a call's place may cost it a whole period: a place moves with every
INSERT_STEP inserted, and where the calls' steps fill most of the cycle only the same place
is clear. Served steps are longer than the warm-up's (the server's media on the GIL, the
engine process's pipe: FlashHead Lite's four calls on an H100 measured 0.28-0.36 s against
0.19 s), so on a GPU every call asks for a few tenths more after its first utterance, and
each grew by the whole 0.96-s cycle (bench/RESULTS.md, nineteenth session). Where lining
every call up on the step they share costs the growing call less, the cycle does that
instead (`line_up`): each call's plan then covers any place, each grows by what that plan
needs, and calls that join later plan on it too, until fewer than two calls are left.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from realtime.engine_timing import EngineTiming

log = logging.getLogger(__name__)

# A second of every later answer's delay weighs this much more than a second of a call's
# first frame: a joining microphone's call rather shows its first frame up to a chunk later
# (Pro's 1.12 s), once, than adds one INSERT_STEP (0.16 s) to its speech-to-lips for good.
DELAY_WEIGHT = 8.0
# Waits closer than this count as equal: choices then go by cost (a step's time varies
# by more than this from one step to the next).
WAIT_RESOLUTION_S = 0.02
CYCLES = 4  # periods simulated: the pattern of turns repeats from the second on


@dataclass(frozen=True)
class Option:
    """One place a call can take: when one of its later steps comes due (monotonic
    seconds; every `period` after and before too), when its first step comes due where
    that has yet to run (None: it ran), and what the option costs it (seconds)."""

    due: float
    cost: float = 0.0
    first_due: float | None = None


@dataclass(frozen=True)
class Choice:
    index: int  # of the option chosen
    wait: float  # the longest a later step of the call waits for the others'
    first_wait: float  # its first step's wait (0 where it ran)
    others: list[float]  # the others' waits for a later step, in the order given
    others_now: float  # the longest any other's step waits for this call's first step


def turns(jobs: list[tuple[float, float, int]]) -> list[float]:
    """Each job's wait, for jobs (due, seconds, call) run one at a time in the order they
    come due. An engine that batches the steps waiting (`pipeline.batching`) ends them
    about as late: a batch of two Pro steps takes 1.056 s on the H200, two alone 1.04 s."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i][0], jobs[i][2]))
    waits = [0.0] * len(jobs)
    free = -math.inf
    for i in order:
        due, seconds, _ = jobs[i]
        start = max(due, free)
        waits[i] = start - due
        free = start + seconds
    return waits


def steady_waits(dues: list[float], seconds: list[float], period: float) -> list[float]:
    """The longest each call's later steps wait for the others', once the turns repeat
    (inf for every call where their steps take more than the period together)."""
    if sum(seconds) >= period:
        return [math.inf] * len(dues)
    phases = [d % period for d in dues]
    jobs = [
        (phase + k * period, s, c)
        for c, (phase, s) in enumerate(zip(phases, seconds, strict=True))
        for k in range(CYCLES)
    ]
    waits = turns(jobs)
    out = [0.0] * len(dues)
    for (due, _, c), wait in zip(jobs, waits, strict=True):
        if due >= period:  # the first period has nobody's earlier step before it
            out[c] = max(out[c], wait)
    return out


def first_step_waits(
    dues: list[float], seconds: list[float], period: float, first: tuple[float, float]
) -> tuple[float, float]:
    """A joining call's first step (due, seconds) among the others' later steps: how long
    it waits, and the longest any other's step waits for it (theirs from a period before
    it on; the joining call's own later steps are left out: they follow their first)."""
    due0, seconds0 = first
    jobs = [(due0, seconds0, 0)]
    for c, (due, s) in enumerate(zip(dues, seconds, strict=True), 1):
        phase = due0 - period + (due - due0 + period) % period  # its first due after due0 - period
        jobs += [(phase + k * period, s, c) for k in range(CYCLES)]
    waits = turns(jobs)
    others = [w for (due, _, c), w in zip(jobs, waits, strict=True) if c and due >= due0]
    return waits[0], max(others, default=0.0)


def _grade(seconds: float) -> float:
    return seconds if math.isinf(seconds) else float(round(seconds / WAIT_RESOLUTION_S))


def choose(
    others: list[float], step_s: float, first_s: float, options: list[Option], period: float
) -> Choice:
    """The option for a call among others whose later steps come due at `others` (each
    step `step_s` long; the call's first, where it has one ahead, `first_s`): the one where
    the others wait least (for its later steps or its first: their frames were planned
    without it), then where it waits least itself (its plan will count that), then the
    cheapest."""
    best: tuple[tuple, Choice] | None = None
    for index, option in enumerate(options):
        dues = [*others, option.due]
        waits = steady_waits(dues, [step_s] * len(dues), period)
        first_wait, others_now = 0.0, 0.0
        if option.first_due is not None:
            first_wait, others_now = first_step_waits(
                others, [step_s] * len(others), period, (option.first_due, first_s)
            )
        choice = Choice(index, waits[-1], first_wait, waits[:-1], others_now)
        theirs = max([*waits[:-1], others_now])
        rank = (_grade(theirs), _grade(waits[-1]), option.cost, index)
        if best is None or rank < best[0]:
            best = (rank, choice)
    if best is None:
        raise ValueError("no option to choose from")
    return best[1]


class Member(Protocol):
    """A call sharing the engine (`realtime.playout.PlayoutControl`)."""

    session_id: str

    @property
    def bursts(self) -> bool:
        """Its steps come back to back (an agent's answer, faster than real time)."""

    def steps_due(self) -> float | None:
        """When one of its later steps comes due (monotonic), once it is planned and fed
        at real time; None before, or for pushed audio."""

    def retime(self, timing: EngineTiming) -> None:
        """Plan on `timing` from now on where that is longer (it never shortens)."""


class StepCycle:
    """The calls sharing one engine, and where their steps fall in its cycle.

    `alone` is a call's plan with the engine to itself; `shared(n)` a call's plan beside
    n - 1 others whose steps line up with its own; `floor`, where the operator asked for
    one (`--plan-sessions`), the least any call plans on."""

    def __init__(
        self,
        period: float,
        alone: EngineTiming,
        shared: Callable[[int], EngineTiming],
        floor: EngineTiming | None = None,
    ) -> None:
        self.period = period
        self.alone = alone
        self._shared = shared
        self._floor = floor
        self._members: dict[str, Member] = {}
        self.lined_up = False  # every call plans on the shared step, whatever its place

    def add(self, member: Member) -> None:
        self._members[member.session_id] = member

    def remove(self, member: Member) -> None:
        if self._members.get(member.session_id) is member:
            del self._members[member.session_id]
        if len(self._members) < 2:  # one call alone has nobody to take turns with
            self.lined_up = False

    @property
    def shared(self) -> EngineTiming:
        """The step of all the calls, lined up (never less than the operator's floor)."""
        return self._at_least_floor(self._shared(len(self._members)))

    def line_up(self, member: Member) -> None:
        """`member` grows cheaper on the shared step than in a place of its own: from now
        on every call plans on the shared step (`share`), and none keeps a place."""
        log.info(
            "session %s: growing in its place would cost it more than every call planning on"
            " the step they share: %d calls now line up",
            member.session_id,
            len(self._members),
        )
        self.lined_up = True
        self.share()

    def waiting(self, steady_wait: float, first_wait: float = 0.0) -> EngineTiming:
        """A call's plan when its later steps wait `steady_wait` for the others' and its
        first `first_wait` (never less than the operator's floor)."""
        return self._at_least_floor(self.alone.waiting(steady_wait, first_wait))

    def _at_least_floor(self, timing: EngineTiming) -> EngineTiming:
        floor = self._floor
        if floor is not None and floor.steady_seconds > timing.steady_seconds:
            return floor
        return timing

    def join(self, member: Member, options: list[Option]) -> tuple[int | None, EngineTiming | None]:
        """A call fed at real time is about to start: the option it takes (None: any), and
        its plan (None: keep the one it has, which counted every call sharing the engine as
        lined up with it). The others are re-planned on what they will wait beside it."""
        others, placed = self._others(member)
        if self.lined_up or any(m.bursts for m in others):
            # an agent's steps come back to back (no place keeps clear of them), or the
            # calls lined up when one grew (`line_up`): the call shares their step
            self.share()
            return None, None
        if not placed:  # calls that have yet to start will take their places around it
            return None, self.waiting(0.0)
        choice = choose(
            [due for _, due in placed],
            self.alone.steady_seconds,
            self.alone.first_seconds,
            options,
            self.period,
        )
        if math.isinf(choice.wait) or self._lining_up_is_shorter(choice):
            self.share()
            return None, None
        self._retime(placed, choice)
        log.info(
            "session %s: its steps placed in the engine's %.2f-s cycle, waiting %.2f s beside %d"
            " call(s) (their longest wait %.2f s, %.2f s once for its first step)",
            member.session_id,
            self.period,
            choice.wait,
            len(placed),
            max(choice.others, default=0.0),
            choice.others_now,
        )
        return choice.index, self.waiting(choice.wait, choice.first_wait)

    def _lining_up_is_shorter(self, choice: Choice) -> bool:
        """Whether the step of a batch of all the calls is shorter than a step of one's own
        and the longest wait beside the others: an engine that batches its steps well is
        better planned so (FlashHead Lite on the H200: three steps batched in 0.26 s, one
        alone 0.18 s), and its calls line up."""
        shared = self._shared(len(self._members)).steady_seconds
        alone = self.alone.steady_seconds
        longest = alone + max([choice.wait, *choice.others])
        return alone < shared <= longest

    def grow(self, member: Member, options: list[Option]) -> int:
        """A started call inserts silence: which of `options` (its steps moved earlier by
        each amount) keeps every call's wait least; the others are re-planned on theirs."""
        others, placed = self._others(member)
        if self.lined_up or member.bursts or not placed or any(m.bursts for m in others):
            return 0
        step = self.alone.steady_seconds
        dues = [due for _, due in placed]
        choice = choose(dues, step, step, options, self.period)
        if math.isinf(choice.wait):
            return 0
        log.debug(
            "session %s: growth options %s (due; cost) beside phases %s: chose %d, waits %.3f,"
            " theirs %s",
            member.session_id,
            [(round(o.due % self.period, 3), round(o.cost, 2)) for o in options],
            [round(d % self.period, 3) for d in dues],
            choice.index,
            choice.wait,
            [round(w, 3) for w in choice.others],
        )
        self._retime(placed, choice)
        return choice.index

    def _others(self, member: Member) -> tuple[list[Member], list[tuple[Member, float]]]:
        """The calls beside `member`, and those of them that have a place: (call, due)."""
        others = [m for m in self._members.values() if m is not member]
        return others, [(m, due) for m in others if (due := m.steps_due()) is not None]

    def _retime(self, placed: list[tuple[Member, float]], choice: Choice) -> None:
        """The placed calls plan on what they will wait beside the one that took `choice`."""
        for (other, _), wait in zip(placed, choice.others, strict=True):
            other.retime(self.waiting(wait))

    def share(self) -> None:
        """Every call plans on the step all of them share (their steps line up)."""
        timing = self.shared
        for member in list(self._members.values()):
            member.retime(timing)
