"""What a session knows of its engine's speed, to plan its playout: `EngineTiming`.

The engine's warm-up measured its steps alone (and, for an engine that batches its
sessions' steps, a batch of each size); serving is slower than warm-up by a measured factor
(`SERVE_SLOWDOWN`), and steps vary (`STEP_SPREAD`). A call plans on the step of its own,
on the step of a batch of every call sharing the engine, or on its own plus what it waits
for the others' (`realtime.stagger`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

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


@dataclass(frozen=True)
class EngineTiming:
    """What a session needs to know of its engine to plan playout."""

    step: Callable[[int], StreamStep]  # the schedule, e.g. `Engine.stream_step`
    first_seconds: float  # wall time of step 0 in serve (warm)
    steady_seconds: float  # and of a later step
    spread: float = 0.0  # how much steps vary, as a fraction of one (added to the margin)
    # from a step's start to its first frames, for an engine that sends them in pieces
    first_frames_first: float | None = None  # step 0
    first_frames_steady: float | None = None  # a later step
    # A later step as the calls sharing the engine when this one opened run it, where that
    # is shorter than the planned `steady_seconds` (`--plan-sessions`): the generation
    # worker's first estimate of its steps, until it has measured its own.
    steady_now: float | None = None

    @classmethod
    def of(
        cls, engine, own_process: bool = False, sessions: int = 1, sharing: int | None = None
    ) -> EngineTiming:
        """From a started engine (`Engine.warmup` measured the step times alone, and an
        engine that batches its sessions' steps, a batch of each size: "steady_x<n>").
        A session planned beside others (`sessions` of them) plans on the step of a batch of
        them all; its first step waits for the others' only where `sharing` calls (this one
        among them; `sessions` unless told) share the engine already. Serving
        is slower, most on a CPU, where the media loop (H.264, Opus, VAD) shares the cores
        with the engine; the plan starts from that and follows the measured steps after."""
        times = engine.step_seconds or {"first": 0.0, "steady": 0.0}
        kind = getattr(getattr(engine, "device", None), "type", "cpu")
        slow = SERVE_SLOWDOWN.get((kind, own_process), 1.0)
        first, steady = times["first"], times["steady"]
        early_first, early_steady = times.get("first_frames"), times.get("steady_first_frames")
        batched = [n for n in range(2, sessions + 1) if f"steady_x{n}" in times]
        steady_now = None
        if batched:  # its steps will run in a batch of them all: each as long as the batch
            n = max(batched)
            alone_steady, steady = steady, times[f"steady_x{n}"]
            # Its first step can wait for the others' later steps (a batch of n - 1 of them,
            # in flight, or in its batch as a group of another shape), then runs alone.
            # Planned as the shared step's length instead, a call joining a Pro call (the
            # H200's times, scripted) began its step 1 late by what the wait exceeded that,
            # and the worker skipped frames it would then have made on time.
            # Planned for more calls than share the engine now (`--plan-sessions`), it waits
            # only for those there: alone, for nobody (planned for all, an agent alone on a
            # Pro server planned for two was due its first frame ~1.0 s after its first
            # audio, where ~0.53 s was enough).
            m = min(n, sessions if sharing is None else sharing) - 1  # the others now
            others = 0.0 if m < 1 else times.get(f"steady_x{m}", alone_steady)
            first += others
            if m + 1 < n:
                steady_now = alone_steady if m < 1 else times.get(f"steady_x{m + 1}", steady)
            # A shared step's first frames come as much later as the step is longer: a call
            # whose step waits for the others' (they did not line up into one batch) shows
            # its first piece only after their work, and in a batch the others' DiT and
            # decode come before it too. Unshifted, a call beside another on the H200 planned
            # 1.65 s, was due its pieces half a step before they existed, and lost 11 % of
            # its frames (bench/RESULTS.md, issue 30).
            if early_first is not None:
                early_first += others
            if early_steady is not None:
                early_steady += steady - alone_steady
        return cls(
            engine.stream_step,
            first * slow,
            steady * slow,
            STEP_SPREAD.get(kind, 0.0),
            None if early_first is None else early_first * slow,
            None if early_steady is None else early_steady * slow,
            None if steady_now is None else steady_now * slow,
        )

    def waiting(self, steady_wait: float, first_wait: float = 0.0) -> EngineTiming:
        """This plan for a call whose later steps wait `steady_wait` for other calls' and
        whose first step waits `first_wait` (`realtime.stagger`): each step, and its first
        frames, later by as much."""

        def later(seconds: float | None, wait: float) -> float | None:
            return None if seconds is None else seconds + wait

        return replace(
            self,
            first_seconds=self.first_seconds + first_wait,
            steady_seconds=self.steady_seconds + steady_wait,
            first_frames_first=later(self.first_frames_first, first_wait),
            first_frames_steady=later(self.first_frames_steady, steady_wait),
            steady_now=None,
        )

    def first_frames(self, steady_seconds: float) -> tuple[float, float] | None:
        """(step 0, a later step) seconds to their first frames, a later step's shifted by
        what it took beyond the plan (a wait for the GPU delays its first frames as much)."""
        if self.first_frames_first is None or self.first_frames_steady is None:
            return None
        late = max(0.0, steady_seconds - self.steady_seconds)
        return self.first_frames_first, self.first_frames_steady + late
