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

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.clock import FPS, FRAME_SECONDS
from pipeline.schedule import StreamStep

# Step time in serve over step time at warm-up, by (device, engine in its own process),
# and the spread of step times (a fraction of a step, added to the margin), all measured
# (bench/RESULTS.md). The demo on 2 cores, in the server's process: 0.33-0.38 s a step
# (peaks 0.5 s) against 0.255 s at warm-up; in its own process on one thread: 0.41 s
# against 0.37 s. rt720 on an H200 in the server's process: as at warm-up (0.51 s); in its
# own process 0.60-0.67 s while the frames crossed shared memory as strided pageable
# arrays, about warm-up's since they leave the GPU frame-major through pinned memory.
SERVE_SLOWDOWN = {("cpu", False): 1.5, ("cpu", True): 1.15, ("cuda", False): 1.05,
                  ("cuda", True): 1.1}  # fmt: skip
STEP_SPREAD = {"cpu": 0.3, "cuda": 0.05}
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
) -> float:
    """The smallest t0 - A0 (plus margin) that has every step's frames ready on time, when
    timeline second t arrives at max(start_s, (t - preroll_s) / rate) after A0: a pre-roll
    of silence is there at `start_s`, the input follows at `rate` times real time."""
    done, worst = 0.0, 0.0
    for step in steps:
        arrived = max(start_s, (step.audio_frames / FPS - preroll_s) / rate)
        seconds = first_seconds if step.index == 0 else steady_seconds
        done = max(arrived, done) + seconds
        worst = max(worst, done - step.first_frame / FPS)
    return worst + margin_s


def plan_playout(
    step: Callable[[int], StreamStep],
    first_seconds: float,
    steady_seconds: float,
    rate: float = 1.0,
    margin_s: float = 0.1,
    start_s: float = 0.0,
    preroll_step_s: float = FRAME_SECONDS,
) -> PlayoutBudget:
    """The budget for a schedule (`step(k)`, e.g. `Engine.stream_step`), measured step times
    and an input at `rate` (1: a microphone) whose first audio is held until `start_s`.

    A microphone gets the pre-roll that makes the first frame as early as the engine's
    speed allows (working through the pre-roll is compute-bound) while speech keeps the
    live bound; pushed audio needs none. A slow engine is planned over two steps: beyond
    that the worker's skips keep the slack the second step had (`realtime.generation`)."""
    keeps_up = steady_seconds < step(1).frames / FPS
    steps = [step(k) for k in range(HORIZON_STEPS if keeps_up else 2)]

    def bound(preroll: float, at_rate: float = 1.0) -> float:
        return required_delay(
            steps, first_seconds, steady_seconds, at_rate, margin_s, preroll, start_s
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
    first = bound(preroll)
    return PlayoutBudget(max(live, first + preroll), first, preroll, keeps_up)


@dataclass(frozen=True)
class EngineTiming:
    """What a session needs to know of its engine to plan playout."""

    step: Callable[[int], StreamStep]  # the schedule, e.g. `Engine.stream_step`
    first_seconds: float  # wall time of step 0 in serve (warm)
    steady_seconds: float  # and of a later step
    spread: float = 0.0  # how much steps vary, as a fraction of one (added to the margin)

    @classmethod
    def of(cls, engine, own_process: bool = False) -> EngineTiming:
        """From a started engine (`Engine.warmup` measured the step times alone). Serving
        is slower, most on a CPU, where the media loop (H.264, Opus, VAD) shares the cores
        with the engine; the plan starts from that and follows the measured steps after."""
        times = engine.step_seconds or {"first": 0.0, "steady": 0.0}
        kind = getattr(getattr(engine, "device", None), "type", "cpu")
        slow = SERVE_SLOWDOWN.get((kind, own_process), 1.0)
        first, steady = times["first"] * slow, times["steady"] * slow
        return cls(engine.stream_step, first, steady, STEP_SPREAD.get(kind, 0.0))


class PlayoutClock:
    """The one clock both tracks pace from: t0 on `time.monotonic()`, set once."""

    def __init__(self) -> None:
        self._started = asyncio.Event()
        self.t0: float | None = None

    def start(self, t0: float) -> None:
        if self.t0 is None:
            self.t0 = t0
            self._started.set()

    async def wait_started(self) -> float:
        await self._started.wait()
        assert self.t0 is not None
        return self.t0

    def frame_now(self) -> int:
        """Index of the video frame due now (0 before start); safe from any thread."""
        t0 = self.t0
        return 0 if t0 is None else max(0, int((time.monotonic() - t0) * FPS))
