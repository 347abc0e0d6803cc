"""Calls taking turns in the engine's cycle: who waits how long, and where a call goes.

FlashHead Pro's numbers where they matter: a 28-frame chunk (1.12 s), a step of 0.52 s
alone, a first step of 0.48 s (the H200, `fp8-fast`).
"""

from __future__ import annotations

import math

import pytest

from realtime.stagger import Option, StepCycle, choose, first_step_waits, steady_waits, turns

CHUNK = 1.12
STEP = 0.52
FIRST = 0.48


def test_steps_come_in_turns_in_the_order_they_come_due():
    # (due, seconds, call): due at 1.1 it waits for the step due at 1.0; due at 1.2, for both
    waits = turns([(1.0, 0.5, 0), (1.2, 0.5, 1), (3.0, 0.5, 2), (1.1, 0.1, 2)])
    assert waits == pytest.approx([0.0, 0.4, 0.0, 0.4])


def test_two_calls_half_a_chunk_apart_never_wait_and_due_together_one_waits_a_step():
    assert steady_waits([0.0, CHUNK / 2], [STEP, STEP], CHUNK) == [0.0, 0.0]
    # a step due 0.1 s after the other's waits the rest of it, every chunk
    assert steady_waits([5 * CHUNK, 0.1], [STEP, STEP], CHUNK) == pytest.approx([0.0, STEP - 0.1])
    # due late in the chunk, its step runs into the next chunk: the other's waits there
    assert steady_waits([0.0, CHUNK - 0.1], [STEP, STEP], CHUNK) == pytest.approx([0.42, 0.0])


def test_steps_that_fill_more_than_a_chunk_wait_without_end():
    waits = steady_waits([0.0, 0.37, 0.74], [0.46] * 3, CHUNK)
    assert all(math.isinf(w) for w in waits)


def test_a_joining_call_is_placed_half_a_chunk_from_the_other():
    """Seven pre-rolls 0.16 s apart cover the chunk; none is exactly half a chunk away.
    The nearest after it would make the other call's step wait 0.02 s; the nearest before
    it, the joining call's own 0.06 s: that one wins, whatever its cost."""
    other = 100.0  # monotonic seconds one of its steps comes due
    options = [Option(other + 0.3 - j * 0.16, cost=j * 0.16) for j in range(7)]
    choice = choose([other], STEP, FIRST, options, CHUNK)
    apart = (options[choice.index].due - other) % CHUNK
    assert apart == pytest.approx(0.46)
    assert choice.others == [0.0] and choice.wait == pytest.approx(STEP - 0.46)


def test_among_equal_places_the_cheapest_wins():
    """A call alone on a quiet engine (steps much shorter than the chunk): every place is as
    good, so it keeps the pre-roll that makes its first frame soonest (cost 0)."""
    costs = [0.48, 0.32, 0.16, 0.0, 0.48, 0.64, 0.8]
    options = [Option(50.0 + j * 0.16, cost) for j, cost in enumerate(costs)]
    choice = choose([0.5], 0.1, 0.1, options, CHUNK)
    assert choice.index == 3


def test_the_others_wait_count_before_the_joining_calls_own():
    """Steps of 0.55 s leave no place 0.16 s apart where neither call waits: the joining
    call takes the wait itself (0.07 s) rather than make the call already there wait as
    long (its frames were planned without the joining call; the joining call plans on its
    wait)."""
    options = [Option(j * 0.16) for j in range(7)]
    choice = choose([0.0], 0.55, 0.55, options, CHUNK)
    assert choice.others == [0.0]
    assert choice.wait == pytest.approx(0.07)


def test_a_joining_calls_first_step_is_placed_clear_of_the_others_steps():
    # due 0.6 s after the other's step: it runs in the gap, nobody waits
    assert first_step_waits([10.0], [STEP], CHUNK, (10.6, FIRST)) == (0.0, 0.0)
    # due 0.2 s after: it waits out the other's step; a first step of 0.75 s (Pro's before
    # `fp8-fast`) then makes the other's next step wait too
    wait, theirs = first_step_waits([10.0], [STEP], CHUNK, (10.2, 0.75))
    assert wait == pytest.approx(STEP - 0.2)
    assert theirs == pytest.approx(STEP + 0.75 - CHUNK)


class Call:
    """A member of the cycle: where its steps come due, and the plans it was given."""

    def __init__(self, session_id: str, due: float | None, bursts: bool = False) -> None:
        self.session_id, self.due, self.bursts = session_id, due, bursts
        self.timings: list = []

    def steps_due(self) -> float | None:
        return self.due

    def retime(self, timing) -> None:
        self.timings.append(timing)


def timings():
    from support.realtime import ScriptedEngine

    from realtime.engine_timing import EngineTiming

    engine = ScriptedEngine(rtf=STEP * 25 / 28, first=28, chunk=28)
    alone = EngineTiming(engine.stream_step, FIRST, STEP)
    shared = EngineTiming(engine.stream_step, FIRST + STEP, 2 * STEP)
    return alone, shared


def test_a_call_joining_one_that_started_plans_on_its_own_step():
    alone, shared = timings()
    cycle = StepCycle(CHUNK, alone, lambda n: shared)
    there, joining = Call("a", 7.0), Call("b", None)
    for call in (there, joining):
        cycle.add(call)
    options = [Option(7.3 - j * 0.16, j * 0.16, 7.3 - j * 0.16 - CHUNK) for j in range(7)]
    index, timing = cycle.join(joining, options)
    assert index is not None and abs((options[index].due - 7.0) % CHUNK - CHUNK / 2) <= 0.16
    assert timing is not None and timing.steady_seconds == pytest.approx(STEP + 0.06)
    assert timing.first_seconds == pytest.approx(FIRST + 0.06)  # due at the same place
    assert there.timings == [alone]  # it waits for nobody either


def test_beside_a_call_yet_to_start_a_call_plans_on_its_own_step():
    """Two calls opened at once: the first to start takes no place in particular and plans
    on its own step; the second, starting after it, takes its place around the first's."""
    alone, shared = timings()
    cycle = StepCycle(CHUNK, alone, lambda n: shared)
    first, second = Call("a", None), Call("b", None)
    for call in (first, second):
        cycle.add(call)
    assert cycle.join(first, [Option(7.3 - j * 0.16) for j in range(7)]) == (None, alone)
    first.due = 7.3
    index, timing = cycle.join(second, [Option(9.0 - j * 0.16) for j in range(7)])
    assert index is not None and timing is not None
    assert abs((9.0 - index * 0.16 - 7.3) % CHUNK - CHUNK / 2) <= 0.16


def test_beside_an_agent_every_call_plans_on_the_shared_step():
    alone, shared = timings()
    cycle = StepCycle(CHUNK, alone, lambda n: shared)
    there, agent, joining = Call("a", 7.0), Call("b", None, bursts=True), Call("c", None)
    for call in (there, agent, joining):
        cycle.add(call)
    assert cycle.join(joining, [Option(7.3 - j * 0.16) for j in range(7)]) == (None, None)
    assert all(call.timings == [shared] for call in (there, agent, joining))


def test_three_calls_whose_steps_overfill_the_chunk_plan_on_the_shared_step():
    alone, shared = timings()
    cycle = StepCycle(CHUNK, alone, lambda n: shared)
    calls = [Call("a", 7.0), Call("b", 7.56), Call("c", None)]
    for call in calls:
        cycle.add(call)
    assert cycle.join(calls[2], [Option(7.3 - j * 0.16) for j in range(7)]) == (None, None)
    assert calls[0].timings == [shared]


def test_a_growing_call_inserts_what_keeps_it_clear_of_the_others():
    """A call half a chunk from another must insert 0.32 s of silence, which would bring its
    steps 0.24 s after the other's, into them. With 0.52-s steps only the same place keeps
    both clear: it inserts a whole chunk."""
    alone, shared = timings()
    cycle = StepCycle(CHUNK, alone, lambda n: shared)
    there, growing = Call("a", 7.0), Call("b", 7.56)
    for call in (there, growing):
        cycle.add(call)
    amounts = [0.32 + j * 0.16 for j in range(7)]
    index = cycle.grow(growing, [Option(7.56 - a, cost=a - 0.32) for a in amounts])
    apart = (7.56 - amounts[index] - 7.0) % CHUNK
    assert STEP <= apart <= CHUNK - STEP, (amounts[index], apart)
    assert amounts[index] == pytest.approx(CHUNK)
    assert there.timings == [alone]  # it waits for nobody: its plan stays its own


def test_calls_lined_up_by_a_growth_stay_lined_up_until_one_is_left():
    """Once a growth lined the calls up (`StepCycle.line_up`), every call plans on the
    shared step and none keeps a place: a joining call shares it, a growing one inserts
    only what it needs. With one call left there is nobody to take turns with."""
    alone, shared = timings()
    cycle = StepCycle(CHUNK, alone, lambda n: shared)
    there, growing, joining = Call("a", 7.0), Call("b", 7.56), Call("c", None)
    for call in (there, growing):
        cycle.add(call)
    cycle.line_up(growing)
    assert cycle.lined_up and there.timings == [shared] and growing.timings == [shared]
    assert cycle.grow(growing, [Option(7.56 - 0.32 - j * 0.16) for j in range(7)]) == 0
    cycle.add(joining)
    assert cycle.join(joining, [Option(7.3 - j * 0.16) for j in range(7)]) == (None, None)
    assert joining.timings == [shared]
    cycle.remove(joining)
    assert cycle.lined_up  # two calls are still lined up
    cycle.remove(growing)
    assert not cycle.lined_up


def test_the_operators_plan_for_several_calls_is_the_least_any_call_plans_on():
    alone, shared = timings()
    cycle = StepCycle(CHUNK, alone, lambda n: shared, floor=shared)
    assert cycle.waiting(0.0) is shared
    assert cycle.waiting(1.0).steady_seconds == STEP + 1.0


def test_calls_whose_batched_steps_are_shorter_than_taking_turns_line_up():
    """FlashHead Lite batches well: its third call would wait longer for the other two's
    steps, in turn, than a batch of all three takes (0.26 s on the H200, against 0.18 s for
    one step alone). So the calls line up, and every one plans on the batch's step."""
    from support.realtime import ScriptedEngine

    from realtime.engine_timing import EngineTiming

    engine = ScriptedEngine(rtf=0.18 * 25 / 24, first=24, chunk=24)
    alone = EngineTiming(engine.stream_step, 0.19, 0.18)
    batched = EngineTiming(engine.stream_step, 0.19 + 0.26, 0.26)
    cycle = StepCycle(0.96, alone, lambda n: batched if n > 1 else alone)
    calls = [Call("a", 7.0), Call("b", 7.1), Call("c", None)]
    for call in calls:
        cycle.add(call)
    options = [Option(7.05 + j * 0.02) for j in range(3)]  # each close to both others'
    assert cycle.join(calls[2], options) == (None, None)
    assert all(call.timings == [batched] for call in calls)
    # placed apart, two calls wait for nobody: they take turns, each on a step of its own
    cycle.remove(calls[1])
    calls[0].timings.clear()
    index, timing = cycle.join(calls[2], [Option(7.0 + j * 0.16) for j in range(6)])
    assert index is not None and timing is not None and timing.steady_seconds == 0.18
