"""Warm-up, the same for every model family: every chunk shape once, then a timed session.

Compilation, autotuning and kernel plans happen here, at start-up (`pipeline.startup`), and
never inside a session's time to first frame. The timed session measures a step, which the
server plans playout on (`StreamingEngine.step_seconds`). An engine offers
`warmup_reference()` (an identity its streams accept without any detection),
`stream_step(k)` and `new_stream(...)`; `warmup_steps` says how many steps its schedule
needs to show every shape (6 by default: N_0, N, I, each SR segment, the stream's end).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.stream import ready_pieces


def warm_up(engine, seed: int = 0) -> float:
    """One throwaway session over every chunk shape, then a timed one, step by step, for
    `engine.step_seconds`; returns (and keeps as `warmup_seconds`) the seconds it took."""
    t = time.perf_counter()
    engine.run_every_shape(seed)
    engine.step_seconds = warm_session(engine, seed, timed=True)
    engine.warmup_seconds = time.perf_counter() - t
    return engine.warmup_seconds


def warm_session(engine, seed: int, timed: bool) -> dict[str, float]:
    """A session of `warmup_steps` steps of a tone. Untimed, all its audio at once; timed,
    each step's audio just before it runs. Returns {"first": step 0, "steady": the median
    later step} — the median, so that a first use left over from the untimed pass (a
    kernel plan, a page fault) does not set the plan — and, for an engine that sends a
    step's frames in pieces, when its first piece existed: "first_frames" (step 0) and
    "steady_first_frames" (the median later step)."""
    steps = getattr(engine, "warmup_steps", 6)
    spf = MODEL_SAMPLES_PER_FRAME
    frames = engine.stream_step(steps - 1).audio_frames
    audio = (0.1 * np.sin(np.arange(frames * spf) * 0.07)).astype(np.float32)
    session = engine.new_stream(engine.warmup_reference(), seed=seed)
    seconds, first_frames, pieces = [], [], 0
    for k in range(steps if timed else 1):
        end = len(audio) if not timed else engine.stream_step(k).audio_frames * spf
        session.push_audio(audio[session.timeline.total : end])
        t = time.perf_counter()
        first = None
        for n, _ in enumerate(ready_pieces(session)):  # frames on the host: the GPU work is done
            first = time.perf_counter() - t if first is None else first
            pieces = max(pieces, n + 1)
        seconds.append(time.perf_counter() - t)
        first_frames.append(seconds[-1] if first is None else first)
    session.finish()
    session.close()
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    out = {"first": seconds[0], "steady": _median_after_first(seconds)}
    if pieces > 1:
        out["first_frames"] = first_frames[0]
        out["steady_first_frames"] = _median_after_first(first_frames)
    return out


def _median_after_first(values: list[float]) -> float:
    later = sorted(values[1:]) or values
    return later[len(later) // 2]
