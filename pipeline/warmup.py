"""Warm-up, the same for every model family: every chunk shape once, then a timed session.

Compilation, autotuning and kernel plans happen here, at start-up (`pipeline.startup`), and
never inside a session's time to first frame. The timed session measures a step, which the
server plans playout on (`StreamingEngine.step_seconds`). An engine offers
`warmup_reference()` (an identity its streams accept without any detection),
`stream_step(k)` and `new_stream(...)`; `warmup_steps` says how many steps its schedule
needs to show every shape (6 by default: N_0, N, I, each SR segment, the stream's end).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.stream import ready_pieces

log = logging.getLogger(__name__)

Progress = Callable[[str], None]  # told each part of start-up as it begins


def no_progress(phase: str) -> None:
    """Where nobody listens for start-up's progress."""


def warm_up(engine, seed: int = 0, progress: Progress | None = None) -> float:
    """One throwaway session over every chunk shape, then a timed one, step by step, for
    `engine.step_seconds`; returns (and keeps as `warmup_seconds`) the seconds it took.
    `progress` hears each part as it begins (`pipeline.startup`)."""
    say = progress or no_progress
    t = time.perf_counter()
    say("warm-up: every chunk shape once (a cold compile spends its minutes here)")
    engine.run_every_shape(seed)
    log.info("warm-up: every chunk shape run in %.1f s", time.perf_counter() - t)
    say("warm-up: timing a session's steps")
    engine.step_seconds = warm_session(engine, seed, timed=True)
    log.info(
        "warm-up: a step takes %.3f s first, %.3f s after",
        engine.step_seconds["first"],
        engine.step_seconds["steady"],
    )
    if getattr(engine, "batcher", None) is not None:
        say("warm-up: timing batched steps")
        engine.step_seconds.update(warm_batches(engine, seed))
        engine.capacity = capacity(engine.step_seconds, engine.chunk_seconds)
        batches = {k: round(v, 3) for k, v in engine.step_seconds.items() if "_x" in k}
        log.info("warm-up: batched steps %s s, capacity %d", batches, engine.capacity)
    engine.warmup_seconds = time.perf_counter() - t
    return engine.warmup_seconds


# A batch's step must leave this share of a chunk's play time free: the media loop, the
# steps' spread and a session's own skew live in the rest.
CAPACITY_MARGIN = 0.85


def capacity(step_seconds: dict[str, float], chunk_seconds: float) -> int:
    """How many sessions fit at real time: the largest batch whose steady step takes at
    most CAPACITY_MARGIN of the play time it makes (at least 1: one session is served as
    fast as the engine can, fresh or not)."""
    fits = 1
    for key, seconds in step_seconds.items():
        if key.startswith("steady_x") and seconds <= CAPACITY_MARGIN * chunk_seconds:
            fits = max(fits, int(key.removeprefix("steady_x")))
    return fits


def warm_batches(engine, seed: int) -> dict[str, float]:
    """Time steps of 2, 3, ... streams run as one batch (`engine.batcher`), up to the
    batcher's size or the first batch slower than real time; {"steady_x<n>": the median
    later step}. The first step of each size also compiles its shapes, here and not in a
    session."""
    spf = MODEL_SAMPLES_PER_FRAME
    steps = getattr(engine, "warmup_steps", 3)
    frames = engine.stream_step(steps - 1).audio_frames
    audio = (0.1 * np.sin(np.arange(frames * spf) * 0.07)).astype(np.float32)
    out: dict[str, float] = {}
    for n in range(2, engine.batcher.max_batch + 1):
        streams = [engine.new_stream(engine.warmup_reference(), seed=seed + i) for i in range(n)]
        seconds = []
        for k in range(steps):
            end = engine.stream_step(k).audio_frames * spf
            for stream in streams:
                stream.push_audio(audio[stream.timeline.total : end])
            seconds.append(run_together(engine.batcher, streams))
        for stream in streams:
            stream.close()
        out[f"steady_x{n}"] = _median_after_first(seconds)
        if out[f"steady_x{n}"] > engine.chunk_seconds:
            break
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return out


def run_together(batcher, streams: list) -> float:
    """One step of each stream as one batch; the seconds from its start to the last frame
    on the host."""
    failed: list[BaseException] = []

    def step(stream) -> None:
        try:
            stream.generate_ready()
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=step, args=(stream,)) for stream in streams]
    with batcher.gathering():
        for thread in threads:
            thread.start()
        while batcher.waiting + len(failed) < len(streams):
            time.sleep(0.001)
        t = time.perf_counter()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return time.perf_counter() - t


# Fresh streams whose step 0 is timed at warm-up (the median is planned on)
FIRST_STEP_SAMPLES = 3


def warm_session(engine, seed: int, timed: bool) -> dict[str, float]:
    """A session of `warmup_steps` steps of a tone. Untimed, all its audio at once; timed,
    each step's audio just before it runs. Returns {"first": step 0, "steady": the median
    later step} — the median, so that a first use left over from the untimed pass (a
    kernel plan, a page fault) does not set the plan — and, for an engine that sends a
    step's frames in pieces, when its first piece existed: "first_frames" (step 0) and
    "steady_first_frames" (the median later step).

    Timed, step 0 is measured on `FIRST_STEP_SAMPLES` fresh streams and the median kept:
    every call's first frame is planned on it (an agent's most of all), and one sample
    alone set it 0.05 s apart from one H200 start-up to the next."""
    steps = getattr(engine, "warmup_steps", 6)
    spf = MODEL_SAMPLES_PER_FRAME
    frames = engine.stream_step(steps - 1).audio_frames
    audio = (0.1 * np.sin(np.arange(frames * spf) * 0.07)).astype(np.float32)
    seconds, first_frames, pieces = _time_steps(
        engine, seed, audio, steps if timed else 1, timed, finish=True
    )
    step0, step0_frames = [seconds[0]], [first_frames[0]]
    for i in range(1, FIRST_STEP_SAMPLES if timed else 1):  # step 0 alone: no end step
        more_seconds, more_first, more_pieces = _time_steps(engine, seed + i, audio, 1, True)
        step0.append(more_seconds[0])
        step0_frames.append(more_first[0])
        pieces = max(pieces, more_pieces)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    out = {"first": statistics.median(step0), "steady": _median_after_first(seconds)}
    if pieces > 1:
        out["first_frames"] = statistics.median(step0_frames)
        out["steady_first_frames"] = _median_after_first(first_frames)
    return out


def _time_steps(
    engine, seed: int, audio: np.ndarray, steps: int, timed: bool, finish: bool = False
) -> tuple[list[float], list[float], int]:
    """A new stream of the warm-up reference through `steps` steps: each step's seconds,
    the seconds to its first piece, and the most pieces a step gave. Untimed, all the
    audio goes in at once (its steps run to the audio's end). `finish`: the stream's end
    step too, before it closes."""
    spf = MODEL_SAMPLES_PER_FRAME
    session = engine.new_stream(engine.warmup_reference(), seed=seed)
    seconds, first_frames, pieces = [], [], 0
    for k in range(steps):
        end = len(audio) if not timed else engine.stream_step(k).audio_frames * spf
        session.push_audio(audio[session.timeline.total : end])
        t = time.perf_counter()
        first = None
        for n, _ in enumerate(ready_pieces(session)):  # frames on the host: the GPU work is done
            first = time.perf_counter() - t if first is None else first
            pieces = max(pieces, n + 1)
        seconds.append(time.perf_counter() - t)
        first_frames.append(seconds[-1] if first is None else first)
    if finish:
        session.finish()
    session.close()
    return seconds, first_frames, pieces


def _median_after_first(values: list[float]) -> float:
    later = sorted(values[1:]) or values
    return later[len(later) // 2]
