"""Benchmark any model family's stream the way a session runs it (`facecast bench --model`).

The engine starts as every command starts it (`pipeline.startup`); one stream of the
benchmark's test card is fed `seconds` of speech-like audio step by step, each step's audio
just before it runs, so a step's wall time is what a live session waits for. Back to back by
default, as an agent pushing speech faster than real time has them run; `paced`, each step
starts when its audio would have come from a live microphone, as a served live call's do (the
GPU then idles between steps, and on the H200 served steps have run 1-8 % faster than steps
back to back: `bench/RESULTS.md`, issue 30). Reported:
generation fps and real-time factor, step times (first, p50, p90, max), seconds per stage
per step, GPU memory at every step (flat over the run, or not) and the start-up.

`bench_sessions` (`--sessions N`): N such streams at once, each on a thread of its own as
a server's sessions are, as fast as the engine makes them; an engine that batches its
sessions' steps (FlashHead) runs the steps waiting together as one batch, any other takes
them in turn. Reported: the engine's aggregate fps, each session's fps and step times, and
whether every session kept up with real time.
"""

from __future__ import annotations

import datetime
import statistics
import threading
import time
from contextlib import nullcontext
from typing import Any

import torch

from pipeline.bench import git_commit, percentile, speech_like_audio, test_card
from pipeline.clock import FPS, MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.startup import EngineOptions, start_engine
from pipeline.stream import ready_pieces, samples_wanted


def bench_stream(opts: EngineOptions, seconds: float, command: str, paced: bool = False) -> dict:
    engine, report = _started(opts)
    cfg, device = engine.cfg, engine.device
    cuda = device.type == "cuda"
    v = cfg.video
    audio = speech_like_audio(seconds)
    # an in-process stream: its audio timeline and stage times are read here
    stream: Any = engine.new_stream(test_card(v.height, v.width), seed=0)
    step_s: list[float] = []
    first_s: list[float] = []  # from a step's start to its first frames
    started: list[float] = []  # paced: each step's start, from the first audio sample's
    step_frames: list[int] = []
    memory: list[int] = []
    first_stages: dict[str, float] = {}
    k = 0
    began = None  # paced: when the audio's first sample came, as a microphone's would
    while stream.timeline.total < len(audio):
        # the next step's audio, and the one after's for a stream that starts it beside this
        # one (LiveAvatar): a server's backlog when the engine is behind real time
        need = min(len(audio), stream.timeline.total + samples_wanted(stream))
        if paced:  # step 0 at once; each later one when its last sample would have come
            now = time.perf_counter()
            began = now - need / MODEL_RATE if began is None else began
            time.sleep(max(0.0, began + need / MODEL_RATE - now))
        stream.push_audio(audio[stream.timeline.total : need])
        t = time.perf_counter()
        made, first = 0, 0.0
        for batch in ready_pieces(stream):  # as a session gets them: the first ones early
            first = first or time.perf_counter() - t
            made += len(batch.frames)
        if made:  # the audio's end can fall short of a step's lookahead: no step ran then
            step_s.append(time.perf_counter() - t)
            if began is not None:
                started.append(t - began)
            first_s.append(first)
            step_frames.append(made)
            memory.append(torch.cuda.memory_allocated(device) if cuda else 0)
            if k == 0:  # a call's first frames wait for this one: where its time goes
                first_stages = dict(stream.times.seconds)
            k += 1
        elif stream.timeline.total < len(audio):
            raise RuntimeError(f"step {k} had the audio its schedule asks for and made no frame")
    stream.finish()
    stages = dict(stream.times.seconds)
    stream.close()
    steady = step_s[1:] or step_s
    frames = sum(step_frames[1:]) or sum(step_frames)
    fps = frames / sum(steady)
    half = len(memory) // 2
    res = {
        "command": command,
        "meta": {**_meta(cfg, device, opts, seconds), "paced": paced},
        "startup": report.to_dict(),
        # the warm-up's steps: alone, and batches of n streams ("steady_x<n>")
        "warmup_step_seconds": engine.step_seconds,
        "capacity": getattr(engine, "capacity", None),
        "steady": {
            "fps": fps,
            "real_time_factor": FPS / fps,
            "frames_per_step": step_frames[1] if len(step_frames) > 1 else step_frames[0],
            "step_first": step_s[0],
            "step_p50": percentile(steady, 50),
            "step_p90": percentile(steady, 90),
            "step_max": max(steady),
            "first_frames_first": first_s[0],
            "first_frames_p50": percentile(first_s[1:] or first_s, 50),
        },
        "stages_per_step": {k: v / len(step_s) for k, v in stages.items()},
        "stages_first_step": first_stages,
        "memory": {
            "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
            "allocated_first_half_max": max(memory[:half] or memory),
            "allocated_second_half_max": max(memory[half:] or memory),
        },
        "steps": step_s,
    }
    if paced:
        res["steps_started_s"] = started
    return res


def bench_sessions(opts: EngineOptions, seconds: float, sessions: int, command: str) -> dict:
    """N streams of `seconds` of audio each, started together, each made as fast as the
    engine makes it (a step's audio pushed just before the step)."""
    engine, report = _started(opts)
    cfg, device = engine.cfg, engine.device
    cuda = device.type == "cuda"
    v = cfg.video
    batches = getattr(engine, "batcher", None) is not None
    turn = nullcontext() if batches else threading.Lock()  # one step at a time, as serve does
    start = threading.Barrier(sessions)
    results: list[dict | BaseException] = [RuntimeError("did not run")] * sessions

    def one(i: int) -> None:
        try:
            audio = speech_like_audio(seconds, seed=i)
            stream: Any = engine.new_stream(test_card(v.height, v.width), seed=i)
            steps: list[float] = []
            frames = k = 0
            start.wait()
            t0 = time.perf_counter()
            while stream.timeline.total < len(audio):
                need = min(len(audio), engine.stream_step(k).audio_frames * MODEL_SAMPLES_PER_FRAME)
                stream.push_audio(audio[stream.timeline.total : need])
                t = time.perf_counter()
                with turn:
                    made = sum(len(batch.frames) for batch in ready_pieces(stream))
                if made:
                    steps.append(time.perf_counter() - t)
                    frames += made
                    k += 1
            wall = time.perf_counter() - t0
            stream.close()
            results[i] = {"frames": frames, "seconds": wall, "fps": frames / wall,
                          "step_p50": statistics.median(steps), "step_max": max(steps)}  # fmt: skip
        except BaseException as e:  # reported below, after every thread has ended
            start.abort()
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,), name=f"bench-session-{i}") for i in range(sessions)]  # fmt: skip
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    per = [r for r in results if isinstance(r, dict)]
    wall = max(r["seconds"] for r in per)
    return {
        "command": command,
        "meta": {**_meta(cfg, device, opts, seconds), "sessions": sessions},
        "startup": report.to_dict(),
        "warmup_step_seconds": engine.step_seconds,
        "capacity": getattr(engine, "capacity", None),
        "batched": batches,
        "aggregate_fps": sum(r["frames"] for r in per) / wall,
        "every_session_real_time": all(r["fps"] >= FPS for r in per),
        "sessions": per,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
    }


def _started(opts: EngineOptions):
    """The engine started as every command starts it, GPU memory counted from here."""
    engine, report = start_engine(opts)
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)
    return engine, report


def _meta(cfg, device: torch.device, opts: EngineOptions, seconds: float) -> dict:
    return {
        "config": cfg.name,
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "commit": git_commit(),
        "compile": opts.compile,
        "precision": opts.precision,
        "seconds": seconds,
    }


def sessions_summary(res: dict) -> str:
    m, per = res["meta"], res["sessions"]
    each = ", ".join(f"{r['fps']:.1f}" for r in per)
    steps = ", ".join(f"{r['step_p50']:.3f}" for r in per)
    how = "batched" if res["batched"] else "in turn"
    verdict = (
        "every session at real time" if res["every_session_real_time"] else "not all at real time"
    )
    return (
        f"{m['config']} compile={m['compile']} precision={m['precision']}, {m['sessions']} "
        f"sessions ({how}): {res['aggregate_fps']:.1f} fps together; each {each} fps, step p50 "
        f"{steps} s; {verdict} ({FPS} fps); capacity measured {res['capacity']}"
    )


def stream_summary(res: dict) -> str:
    s, m = res["steady"], res["memory"]
    stages = " ".join(f"{k}={v:.3f}s" for k, v in res["stages_per_step"].items())
    warm = res.get("warmup_step_seconds") or {}
    batched = " ".join(f"{k[7:]}={v:.3f}s" for k, v in warm.items() if k.startswith("steady_x"))
    peak = f"{m['peak_bytes'] / 1e9:.2f} GB" if m["peak_bytes"] else "-"
    paced = ", steps paced as a live call's" if res["meta"].get("paced") else ""
    return (
        f"{res['meta']['config']} compile={res['meta']['compile']} "
        f"precision={res['meta']['precision']}{paced}: {s['fps']:.1f} fps (RTF "
        f"{s['real_time_factor']:.3f}), step p50 {s['step_p50']:.3f}s p90 {s['step_p90']:.3f}s "
        f"first {s['step_first']:.3f}s for {s['frames_per_step']} frames; first frames after "
        f"{s['first_frames_first']:.3f}s (step 0), {s['first_frames_p50']:.3f}s (p50); "
        f"per step {stages}; batched steps {batched} (capacity {res['capacity']}); "
        f"peak {peak}, allocated {m['allocated_first_half_max'] / 1e9:.2f} → "
        f"{m['allocated_second_half_max'] / 1e9:.2f} GB"
    )
