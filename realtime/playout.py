"""The playout delay, from a latency budget: the schedule's bursts and the engine's speed.

Frames leave at `t0 + n/25`. The engine makes them in steps (`pipeline.schedule.StreamStep`):
step k can run once its audio has arrived (`audio_frames`, lookahead included) and step
k-1 has finished; it takes G_k seconds, then frames [first_frame, end_frame) exist at once.
With the input arriving at `rate` times real time from A0, the delay D = t0 - A0 covers
every step when

    D >= done_k - first_frame_k / 25 + margin   for every k,

done_k being when step k finishes, counted from A0. This module computes that bound; the
session starts its clock with it and re-sets it only between utterances.

Two delays matter for a live microphone. The first step is short (a short N_0), so the
first frame can leave early (`first`); later steps need more audio per frame shown, so
keeping up needs a longer delay (`steady`). The session starts with `first` while the
peer is quiet, then grows to `steady` by inserting silence before speech starts, which is
invisible: the avatar idles a little longer. For an engine slower than real time the bound
grows without end; the worker skips backlog instead, and the delay covers one step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.schedule import StreamStep

FPS = 25
HORIZON_STEPS = 6  # enough for the bound to settle: the schedule repeats after step 1


@dataclass(frozen=True)
class PlayoutBudget:
    first: float  # seconds from the first audio to the first frame, covering step 0 only
    steady: float  # the same, covering every step: what keeps every frame on time
    keeps_up: bool  # a steady step takes less time than the video it makes


def required_delay(
    steps: list[StreamStep],
    first_seconds: float,
    steady_seconds: float,
    rate: float = 1.0,
    margin_s: float = 0.0,
) -> float:
    """The smallest D = t0 - A0 (plus margin) that has every step's frames ready on time."""
    done, worst = 0.0, 0.0
    for step in steps:
        arrived = step.audio_frames / FPS / rate
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
) -> PlayoutBudget:
    """The budget for a schedule (`step(k)`, e.g. `Engine.stream_step`) and measured step
    times. A slow engine is planned over two steps: beyond that the worker's skips keep the
    slack the second step had (`realtime.worker`)."""
    steady_step = step(1)
    keeps_up = steady_seconds < steady_step.frames / FPS
    horizon = HORIZON_STEPS if keeps_up else 2
    steps = [step(k) for k in range(horizon)]
    return PlayoutBudget(
        first=required_delay(steps[:1], first_seconds, steady_seconds, rate, margin_s),
        steady=required_delay(steps, first_seconds, steady_seconds, rate, margin_s),
        keeps_up=keeps_up,
    )


@dataclass(frozen=True)
class EngineTiming:
    """What a session needs to know of its engine to plan playout."""

    step: Callable[[int], StreamStep]  # the schedule, e.g. `Engine.stream_step`
    first_seconds: float  # measured wall time of step 0 (warm)
    steady_seconds: float  # and of a later step

    @classmethod
    def of(cls, engine) -> EngineTiming:
        """From a started engine (`Engine.warmup` measured the step times)."""
        times = engine.step_seconds or {"first": 0.0, "steady": 0.0}
        return cls(engine.stream_step, times["first"], times["steady"])
