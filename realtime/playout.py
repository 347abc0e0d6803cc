"""The playout delay, from a latency budget: the schedule's bursts and the engine's speed.

Frames leave at `t0 + n/25`. The engine makes them in steps (`pipeline.schedule.StreamStep`):
step k can run once its audio has arrived (`audio_frames`, lookahead included) and step
k-1 has finished; it takes G_k seconds, then frames [first_frame, end_frame) exist at once.
With the input arriving at `rate` times real time from A0, the delay D = t0 - A0 covers
every step when

    D >= done_k - first_frame_k / 25 + margin   for every k,

done_k being when step k finishes, counted from A0. This module computes that bound; the
session starts its clock (`PlayoutClock`, the one both tracks pace from) with it and
re-sets it only between utterances.

For a live microphone the session starts the timeline with a pre-roll of silence, so that
the first step runs at once (its audio is the pre-roll) and the avatar appears within a
step's time, idle, while speech still meets its frames at the steady delay: frame n's
audio arrives `delay - preroll` before the clock shows it, which is what the bound needs.
For an engine slower than real time the bound grows without end; the worker skips backlog
instead (`realtime.generation`), and the delay covers two steps.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.clock import FPS, FRAME_SECONDS, OUTPUT_RATE
from pipeline.schedule import StreamStep
from realtime.buffers import FrameQueue, PlayoutClock
from realtime.engine_timing import EngineTiming
from realtime.events import message
from realtime.stagger import DELAY_WEIGHT, Option

if TYPE_CHECKING:
    from realtime.control import Interrupt
    from realtime.metrics import RealtimeMetrics
    from realtime.stagger import StepCycle

log = logging.getLogger(__name__)

HORIZON_STEPS = 6  # enough for the bound to settle: the schedule repeats after step 1


@dataclass(frozen=True)
class PlayoutBudget:
    delay: float  # seconds from an audio sample's arrival to its frame leaving
    first_frame: float  # seconds from the first audio to the first frame (t0 - A0)
    preroll: float  # seconds of silence the timeline starts with (0 for pushed audio)
    keeps_up: bool  # a steady step takes less time than the video it makes


def required_delay(
    steps: list[StreamStep],
    first_seconds: float,
    steady_seconds: float,
    rate: float = 1.0,
    margin_s: float = 0.0,
    preroll_s: float = 0.0,
    start_s: float = 0.0,
    first_frames: tuple[float, float] | None = None,
) -> float:
    """The smallest t0 - A0 (plus margin) that has every step's frames ready on time, when
    timeline second t arrives at max(start_s, (t - preroll_s) / rate) after A0: a pre-roll
    of silence is there at `start_s`, the input follows at `rate` times real time.

    A step's frames all exist when it ends, or, for an engine that sends them in pieces,
    its first frames `first_frames` (step 0's, a later step's) after it starts and the
    rest, no slower than the video plays, by its end: then its first frame's deadline and
    its last frame's bound the step.

    The margin covers every deadline but one: the stream's very first frame. The clock
    starts when that frame exists (`PlayoutControl.start`), so a step 0 later than planned
    moves the start by as much and makes no frame late; a margin there would only hold back
    every first frame (an agent's first answer most of all)."""
    early = first_frames or (first_seconds, steady_seconds)
    done, worst, first_frame_at = 0.0, 0.0, 0.0
    for step in steps:
        arrived = max(start_s, (step.audio_frames / FPS - preroll_s) / rate)
        seconds, first = (
            (first_seconds, early[0]) if step.index == 0 else (steady_seconds, early[1])
        )
        began, done = max(arrived, done), max(arrived, done) + seconds
        first_due = began + min(first, seconds) - step.first_frame / FPS
        if step.index == 0:
            first_frame_at = first_due
        else:
            worst = max(worst, first_due)
        worst = max(worst, done - (step.end_frame - 1) / FPS)
    return max(first_frame_at, worst + margin_s)


def plan_playout(
    step: Callable[[int], StreamStep],
    first_seconds: float,
    steady_seconds: float,
    rate: float = 1.0,
    margin_s: float = 0.1,
    start_s: float = 0.0,
    preroll_step_s: float = FRAME_SECONDS,
    first_frames: tuple[float, float] | None = None,
    preroll_s: float | None = None,
) -> PlayoutBudget:
    """The budget for a schedule (`step(k)`, e.g. `Engine.stream_step`), measured step times
    and an input at `rate` (1: a microphone) whose first audio is held until `start_s`.

    A microphone gets the pre-roll that makes the first frame as early as the engine's
    speed allows (working through the pre-roll is compute-bound) while speech keeps the
    live bound; pushed audio needs none. A slow engine is planned over two steps: beyond
    that the worker's skips keep the slack the second step had (`realtime.generation`).
    `first_frames`: when a step's first frames exist, for an engine that sends them early
    (`required_delay`): the first chunk of a call is then planned for its earliest frame.
    `preroll_s`: a microphone's pre-roll as chosen elsewhere (`realtime.stagger` places the
    call's steps with it), instead of the one that makes the first frame soonest."""
    keeps_up = steady_seconds < step(1).frames / FPS
    steps = [step(k) for k in range(HORIZON_STEPS if keeps_up else 2)]

    def bound(preroll: float, at_rate: float = 1.0) -> float:
        return required_delay(
            steps, first_seconds, steady_seconds, at_rate, margin_s, preroll, start_s, first_frames
        )

    if rate > 1.0:
        first = bound(0.0, rate)
        return PlayoutBudget(first, first, 0.0, keeps_up)
    live = bound(0.0)  # what speech needs from its arrival to its frame
    if not keeps_up:
        # The worker's skips can only take audio that has arrived: to place a step's new
        # frames (and the `carry` the next step emits) after they exist, the audio arriving
        # now must be due two steps, plus the carry, plus the margin from now.
        carry = (step(1).audio_frames - step(1).end_frame) / FPS
        live = max(live, 2 * steady_seconds + carry + margin_s)
    soonest = bound(live)  # the first frame when the engine works through pre-roll only
    # in whole steps of what the session can insert (frames, VAD windows)
    preroll = math.floor(max(0.0, live - soonest) / preroll_step_s + 1e-9) * preroll_step_s
    if preroll_s is not None:
        preroll = preroll_s
    first = bound(preroll)
    return PlayoutBudget(max(live, first + preroll), first, preroll, keeps_up)


PROBE_S = 0.1  # the first audio is held this long to tell a microphone from a push
# Inserted silence comes in 160 ms steps: whole video frames (40 ms) and whole VAD windows
# (32 ms), so neither the frames' audio nor the VAD's window phase shifts (silero's speech
# edges move by up to 0.1 s with the phase).
INSERT_STEP = 160 * OUTPUT_RATE // 1000


def _ignore(at: int | None) -> None:
    pass


class PlayoutControl:
    """One session's playout delay, from plan to growth, and the clock it starts.

    The first `PROBE_S` of input is held to measure its rate (a microphone, or an agent
    pushing faster than real time); then the delay is planned (`plan_playout`), a
    microphone's timeline gets its pre-roll, and the held audio goes on. The clock starts
    when the first frames exist, so that audio meets its frame at the planned delay. After
    an utterance the delay may be re-planned longer (`replan`), and is reached while nobody
    speaks by inserting silence (`grow`); it never shrinks mid-session. Silence and held
    audio reach the session's timeline through `ingest`, and every insertion is told to
    the peer (`delay_grown`) through `send`.
    """

    def __init__(
        self,
        timing: EngineTiming,
        frames: FrameQueue,
        metrics: RealtimeMetrics,
        send: Callable[[str], None],
        ingest: Callable[[np.ndarray, float | None], int | None],
        step_seconds: Callable[[], float],
        margin_s: float,
        fixed_delay_s: float | None = None,
        interrupt_tail_s: float = 0.48,
        session_id: str = "",
        cycle: StepCycle | None = None,
        engine_shift: Callable[[], float] = lambda: 0.0,
        agent_speech: Callable[[], bool] = lambda: False,
    ) -> None:
        """`send` tells the peer (the control channel), `ingest` puts silence and held audio
        on the timeline (the audio-in part), `step_seconds` is the engine's step as measured
        in this session (the engine feed). `cycle`: the engine's calls, among which this one
        places its steps (`realtime.stagger`); `engine_shift`: seconds of timeline the engine
        never heard (skipped, or cut by an interrupt), by which its steps come later;
        `agent_speech`: the peer speaks through utterances (pushed faster than real time)."""
        self.clock = PlayoutClock()
        self.session_id = session_id  # for the log's lines on the delay
        self.timing = timing
        self.steady_step = timing.step(1)
        self._frames = frames
        self._metrics = metrics
        self._ingest = ingest
        self._send = send
        self._step_seconds = step_seconds
        self._margin_s = margin_s
        self._fixed_delay_s = fixed_delay_s
        self._tail_frames = math.ceil(interrupt_tail_s * FPS)
        self.first_audio: float | None = None  # when the first input arrived (monotonic)
        self.budget: PlayoutBudget | None = None
        self.delay_s: float | None = None  # audio arrival → its frame, as started
        self.planned: float | None = None  # decided after the first PROBE_S of audio
        self.preroll_s = 0.0  # silence the timeline starts with (a microphone's)
        # audio of the probe, with what to tell once it is on the timeline
        self._held: list[tuple[np.ndarray, float, Callable[[int | None], None]]] = []
        self._target: float | None = None  # what the delay grows to while quiet
        self._announced: float | None = None  # the last target logged at info
        self.inserted_s = 0.0  # silence inserted: the pre-roll and later growth
        self.grown_s = 0.0  # of which growth after the start
        self.pushed = False  # planned for audio faster than real time (an agent's)
        self._cycle = cycle
        self._engine_shift = engine_shift
        self._agent_speech = agent_speech
        self._shared_told = False  # the other calls were told its steps come in bursts
        if cycle is not None:
            cycle.add(self)

    def plan(
        self,
        rate: float = 1.0,
        timing: EngineTiming | None = None,
        preroll_s: float | None = None,
    ) -> PlayoutBudget:
        """The budget on the engine's steps as planned (`timing`, default the call's own)
        or, once the call has started, as measured where that is longer; a microphone's
        pre-roll as `plan_playout` chooses it, or `preroll_s`."""
        timing = timing or self.timing
        steady = timing.steady_seconds
        if self.clock.t0 is not None:  # before, the engine's step is the plan's estimate
            steady = max(steady, self._step_seconds())
        first, first_frames = timing.first_seconds, timing.first_frames(steady)
        if self.clock.t0 is not None:
            # started: its step 0 is behind it and every step ahead is a later one, so a
            # re-plan grows the delay by what those need only
            first = steady
            if first_frames is not None:
                first_frames = (first_frames[1], first_frames[1])
        margin = self._margin_s + timing.spread * steady
        return plan_playout(
            timing.step,
            first,
            steady,
            rate,
            margin,
            start_s=PROBE_S,
            preroll_step_s=INSERT_STEP / OUTPUT_RATE,
            first_frames=first_frames,
            preroll_s=preroll_s,
        )

    def steps_due(self) -> float | None:
        """When one of its later steps comes due (monotonic; every chunk before and after
        too), for a call fed at real time once planned: timeline second t of its input
        arrived at `first_audio + t - inserted` (the pre-roll and growth are on the
        timeline, not from the peer), and a step is due when the audio it needs is there."""
        if self.planned is None or self.bursts or self.first_audio is None:
            return None
        need = self.steady_step.audio_frames / FPS + self._engine_shift()
        return self.first_audio - self.inserted_s + need

    @property
    def bursts(self) -> bool:
        """Its steps come back to back while an agent's answer arrives faster than real
        time (pushed from the start, or through utterances): no place in the engine's cycle
        is its own, nor keeps clear of it."""
        return self.pushed or self._agent_speech()

    def _place(self, first_audio: float) -> float | None:
        """A microphone's call about to start: among the pre-rolls it can take (less than
        the soonest first frame's, its first frame later; more, its delay longer), the one
        that puts its steps where the engine is free of the other calls' (`StepCycle.join`).
        Sets its plan; returns the pre-roll (None: as `plan_playout` chooses it)."""
        cycle = self._cycle
        assert cycle is not None
        quantum = INSERT_STEP / OUTPUT_RATE
        alone = cycle.alone
        base = self.plan(1.0, alone)
        places = math.ceil(cycle.period / quantum - 1e-9)
        fewer = [
            base.preroll - j * quantum for j in range(places) if j * quantum <= base.preroll + 1e-9
        ]
        prerolls = fewer + [base.preroll + j * quantum for j in range(1, places - len(fewer) + 1)]
        now = time.monotonic()
        step0 = self.timing.step(0).audio_frames / FPS
        options = []
        for preroll in prerolls:
            budget = self.plan(1.0, alone, preroll)
            cost = (
                budget.first_frame - base.first_frame + DELAY_WEIGHT * (budget.delay - base.delay)
            )
            due = first_audio - preroll + self.steady_step.audio_frames / FPS
            first_due = max(now, first_audio + step0 - preroll)
            options.append(Option(due, max(0.0, cost), first_due))
        index, timing = cycle.join(self, options)
        if timing is not None:
            self.timing = timing
        return None if index is None else prerolls[index]

    def probe(
        self,
        pcm48: np.ndarray,
        arrived: float,
        first_audio: float,
        placed: Callable[[int | None], None] = _ignore,
    ) -> None:
        """Hold input until the delay is planned (`planned` is None until then)."""
        self._held.append((pcm48, arrived, placed))
        if arrived - first_audio >= PROBE_S:
            self.decide_start(first_audio)

    def decide_start(self, first_audio: float) -> None:
        """After the probe: plan the delay at the input's rate, and give a microphone's
        timeline its pre-roll (the step-0 audio exists at once: the first frame leaves a
        step's time after the probe, and speech keeps the planned delay)."""
        held = sum(p.size for p, _, _ in self._held) / OUTPUT_RATE
        rate = held / max(PROBE_S, time.monotonic() - first_audio)
        self.pushed = pushed = rate > 1.5  # an agent's audio, faster than real time
        fixed, cycle = self._fixed_delay_s, self._cycle
        preroll = None
        if cycle is not None and pushed:
            self._shared_told = True
            cycle.share()  # its steps come back to back: the others can only share them
        elif cycle is not None and fixed is None:
            preroll = self._place(first_audio)
        self.budget = budget = self.plan(min(rate, 10.0) if pushed else 1.0, preroll_s=preroll)
        if fixed is not None:  # a set delay, all of it between first audio and first frame
            budget = PlayoutBudget(fixed, fixed, 0.0, budget.keeps_up)
        self.planned = budget.first_frame
        if budget.preroll:
            samples = round(budget.preroll * OUTPUT_RATE / INSERT_STEP) * INSERT_STEP
            if samples:
                self.preroll_s = samples / OUTPUT_RATE
                self.inserted_s += self.preroll_s
                self._ingest(np.zeros(samples, np.int16), None)
                self._send_delay_grown(0, samples, budget.delay)
        for pcm48, arrived, placed in self._held:
            placed(self._ingest(pcm48, arrived))
        self._held = []

    def start(self) -> None:
        """The first frames exist: start the clock so that audio meets its frame at the
        planned delay (never in the past)."""
        now = time.monotonic()
        first_audio = self.first_audio if self.first_audio is not None else now
        planned = self.planned if self.planned is not None else 0.0
        t0 = max(first_audio + planned, now)
        self.delay_s = t0 - first_audio + self.preroll_s
        self._metrics.playout_delay.observe(self.delay_s)
        self.set_lead(self.delay_s)
        self.clock.start(t0)

    def replan(self) -> None:
        """After an utterance: if generation got slower than planned, aim for a longer delay
        (reached while quiet by `grow`). The delay never shrinks mid-session."""
        if self.clock.t0 is None or self._fixed_delay_s is not None:
            return
        target = self.plan().delay
        current = self._target or (self.delay_s or 0.0) + self.grown_s
        if target > current + 0.02:
            # a target is said once (within 0.02 s): where the timeline already holds it,
            # `grow` inserts nothing and clears it, and every later pause would say it again
            said = self._announced is not None and target <= self._announced + 0.02
            level = logging.DEBUG if said else logging.INFO
            log.log(
                level,
                "session %s: playout delay %.2f s, to grow to %.2f s at the next pause",
                self.session_id,
                current,
                target,
            )
            self._announced = self._target = target
            self.set_lead(target)

    def retime(self, timing: EngineTiming) -> None:
        """The engine's steps got longer (more calls share it): plan on `timing` from now on.
        Planned but not started (no frame shown yet), the first frame simply comes later by
        what the longer delay needs; started, the delay grows at the next pause (`replan`).
        A shorter step changes nothing: the delay never shrinks mid-session. A call planned
        for pushed audio keeps its delay: its audio comes ahead of its frames, and a
        live-rate plan would add a second or more before every later utterance of the
        agent's."""
        if timing.steady_seconds <= self.timing.steady_seconds:
            return
        log.info(
            "session %s: the engine's step is now %.2f s (was %.2f: calls share it)%s",
            self.session_id,
            timing.steady_seconds,
            self.timing.steady_seconds,
            "; planned for pushed audio, the delay stays" if self.pushed else "",
        )
        self.timing = timing
        if self.pushed:
            return
        if self.clock.t0 is None and self.planned is not None and self._fixed_delay_s is None:
            # the delay at the start is t0 - first audio + pre-roll, t0 the planned first frame
            planned = max(self.planned, self.plan().delay - self.preroll_s)
            log.info(
                "session %s: its first frame planned %.2f s after its first audio (was %.2f)",
                self.session_id,
                planned,
                self.planned,
            )
            self.planned = planned
            return
        self.replan()

    def grow(self, timeline_head: int, last_rx: float | None, quiet: bool) -> None:
        """While nobody speaks (`quiet`: no speech, no utterance open, no speech start on
        its way from the VAD), insert silence so that the delay reaches its target."""
        target, t0 = self._target, self.clock.t0
        if target is None or t0 is None or last_rx is None or not quiet:
            return
        # the delay the newest peer audio will see: its timeline slot minus its arrival
        current = t0 + timeline_head / OUTPUT_RATE - last_rx
        missing = target - current
        if missing > 0.02:
            samples = math.ceil(missing * OUTPUT_RATE / INSERT_STEP) * INSERT_STEP
            placed = samples + INSERT_STEP * self._place_growth(samples)
            lined = self._lined_up_growth(target, current)
            samples = placed if lined is None else min(placed, lined)
            line_up = samples < placed
            self.inserted_s += samples / OUTPUT_RATE
            self.grown_s += samples / OUTPUT_RATE
            self._ingest(np.zeros(samples, np.int16), None)
            delay = current + samples / OUTPUT_RATE
            log.info("session %s: playout delay grown to %.2f s", self.session_id, delay)
            self._metrics.playout_delay.observe(delay)
            self._send_delay_grown(timeline_head, samples, delay)
            if line_up:
                assert self._cycle is not None
                self._target = None  # reached: the re-plan on the shared step finds it so
                self._cycle.line_up(self)  # the others re-plan, and grow at their pauses
        else:  # debug: a call whose delay already covers its plan says so at every pause
            log.debug(
                "session %s: playout delay already %.2f s (target %.2f s): nothing inserted",
                self.session_id,
                current,
                target,
            )
        self._target = None

    def _place_growth(self, samples: int) -> int:
        """How many INSERT_STEPs more than `samples` to insert, so that the call's steps
        (earlier by what it inserts) fall where the engine is free of the others'."""
        due = self.steps_due()
        if self._cycle is None or due is None:
            return 0
        amounts = [
            (samples + j * INSERT_STEP) / OUTPUT_RATE
            for j in range(math.ceil(self._cycle.period * OUTPUT_RATE / INSERT_STEP - 1e-9))
        ]
        options = [Option(due - a, DELAY_WEIGHT * (a - amounts[0])) for a in amounts]
        return self._cycle.grow(self, options)

    def _lined_up_growth(self, target: float, current: float) -> int | None:
        """Samples to insert were every call to plan on the step they share (where the
        call's steps fall then matters to nobody's plan): what that plan's delay, or the
        target if longer, needs. None where the call keeps no place."""
        cycle = self._cycle
        if cycle is None or cycle.lined_up or self.bursts or self.steps_due() is None:
            return None
        delay = max(target, self.plan(timing=cycle.shared).delay)
        return math.ceil((delay - current) * OUTPUT_RATE / INSERT_STEP) * INSERT_STEP

    def _send_delay_grown(self, at: int, samples: int, delay: float) -> None:
        """Peers that align the returned audio with what they sent need each insertion."""
        self._send(
            message(
                "delay_grown",
                at_ms=round(at * 1000 / OUTPUT_RATE),
                added_ms=round(samples * 1000 / OUTPUT_RATE),
                delay_ms=round(delay * 1000),
            )
        )

    def tick(self) -> None:
        """The control loop, about every 0.1 s (before `grow`): plan once the probe has
        passed, when the input went quiet during it."""
        if self.planned is None and self.first_audio is not None:
            if time.monotonic() - self.first_audio >= PROBE_S:
                self.decide_start(self.first_audio)
        if self._cycle is not None and not self._shared_told and self.bursts:
            self._shared_told = True  # an agent began to speak through utterances
            self._cycle.share()

    def interrupt(self, cut: Interrupt) -> None:
        """The frame due now, and how much of the flushed speech may still be shown."""
        cut.now = self.clock.frame_now()
        cut.tail = self._tail_frames

    def stop(self) -> None:
        pass  # the clock stops with the tracks that read it

    async def close(self) -> None:
        """The session closed: drop the other parts' callbacks (a reference cycle through
        them would keep the closed call in memory until a full garbage collection)."""
        if self._cycle is not None:
            self._cycle.remove(self)
        self._agent_speech = lambda: False
        self._engine_shift = lambda: 0.0  # it read the feed, which holds this control
        self._ingest = lambda pcm48, arrived: None
        self._send = lambda text: None
        steady = self._step_seconds()
        self._step_seconds = lambda: steady  # not through self: no cycle of its own
        self._held = []

    def set_lead(self, delay_s: float) -> None:
        """Generation may run ahead of playout by the delay plus a step (it must, to keep
        the delay's worth of frames queued)."""
        frames = math.ceil(delay_s * FPS) + 2 * self.steady_step.frames
        self._frames.lead = max(self._frames.lead, frames)
