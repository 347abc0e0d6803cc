"""The diffusion stack's stage benchmark: where the time, FLOPs and memory of a session go.

`facecast bench --config rt720 --seconds 20 --json bench/results/rt720.json` loads the
engine, warms it up (compilation and kernel choice happen here and are reported apart),
then streams synthetic speech-like audio into one session, one N chunk's audio at a time,
as fast as the engine takes it, and measures:

- time to first frame: from pushing the first chunk's audio to the first RGB frames on the
  host, split by stage (the reference's init runs at session start and is reported apart);
- steady state: fps, real-time factor, p50/p99 wall time per chunk against its duration;
- each stage's GPU time inside the pipeline (CUDA events around every stage call) and in
  isolation (the same calls replayed alone, synchronised); pipeline efficiency =
  sum of isolated stage times / pipeline wall time per chunk;
- peak GPU memory after 10 s of video and at the end;
- model switch overhead: GPU idle time between one stage's last kernel and the next
  stage's first (event gaps), and with offload the stalls waiting for weight copies;
- FLOPs per chunk per stage, counted (torch's FlopCounterMode for matmuls and convolutions,
  useful attention FLOPs from the attention shapes and masks), achieved TFLOP/s and the
  fraction of the H200's measured bf16 peak; and the floors they imply.

Legend: a "chunk" is one step of the stream: N_k plus I_{k-1} and their SR + decode, i.e.
`schedule.chunk_latents * diffusion.vae.temporal_ratio` video frames (0.96 s for rt720).
The tables it writes are `pipeline.diffusion.bench_report`'s; the input and timing helpers
every benchmark shares are `pipeline.bench`'s.
"""

from __future__ import annotations

import datetime
import logging
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from pipeline.bench import Clock, git_commit, percentile, speech_like_audio, test_card
from pipeline.clock import MODEL_RATE
from pipeline.diffusion.bench_flops import H200_BF16_PEAK, count_call_flops, flops_report

log = logging.getLogger("facecast.bench")

STAGES = ("context", "a2v", "sr", "decode")


@dataclass
class BenchOptions:
    config: str = "rt720"
    seconds: float = 20.0  # seconds of video to stream after the first chunk
    device: str = "auto"
    attention: str | None = None  # override runtime.attention (sdpa, flex, facecast)
    compile: bool = False
    compile_cache: str | None = None  # a folder for what --compile builds
    sdpa_pick: bool = True
    offload: bool = False
    prefetch: int = 2
    memory_cap_gb: float | None = None  # hard cap (torch per-process memory fraction)
    offload_budget_gb: float | None = None
    warmup: bool = True
    isolated_reps: int = 3
    precision: str = "default"
    count_flops: bool = True
    seed: int = 0
    overrides: dict = field(default_factory=dict)


# -- timing -----------------------------------------------------------------------------------
@dataclass
class StageCall:
    stage: str
    chunk: int  # index of the stream step (generate_ready call) it ran in
    start: object
    end: object
    key: tuple  # what makes two calls the same work (shapes)


class StageRecorder:
    """Wraps a session's stage objects: events around every call, inputs kept for replay."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[StageCall] = []
        self.replay: dict[tuple, tuple] = {}  # (stage, key) → (fn, args)
        self.chunk = 0

    def install(self, session) -> None:
        for name in STAGES:
            stage = getattr(session, name)
            stage.run = self._wrap(name, stage.run)

    def _wrap(self, name: str, fn):
        def run(*args):
            start = self.clock.mark()
            out = fn(*args)
            end = self.clock.mark()
            key = _work_key(name, args)
            self.calls.append(StageCall(name, self.chunk, start, end, key))
            if (name, key) not in self.replay:
                kept = tuple(dict(a) if isinstance(a, dict) else a for a in args)
                self.replay[(name, key)] = (fn, kept)
            return out

        return run


def _work_key(stage: str, args: tuple) -> tuple:
    if stage in ("context", "a2v"):
        chunk = args[1] if stage == "context" else args[0].chunk
        return (chunk.kind, chunk.length, len(chunk.known))
    if stage == "sr":
        return (tuple(args[0].shape), args[1])
    cache = args[1]
    return (tuple(args[0].shape), cache is None)


# -- the run ----------------------------------------------------------------------------------
def engine_options(opts: BenchOptions):
    """The benchmark's engine, started like every command's (`pipeline.startup`)."""
    from pipeline.startup import EngineOptions

    return EngineOptions(
        config=opts.config,
        device=opts.device,
        attention=opts.attention,
        compile=opts.compile,
        compile_cache=opts.compile_cache,
        sdpa_pick=opts.sdpa_pick,
        offload=opts.offload,  # False: resident even when large (the resident rows)
        prefetch=opts.prefetch,
        memory_cap_gb=opts.memory_cap_gb,
        offload_budget_gb=opts.offload_budget_gb,
        warmup=opts.warmup,
        record_stalls=True,
        precision=opts.precision,
        overrides=dict(opts.overrides),
    )


def run_bench(opts: BenchOptions) -> dict:
    from pipeline.diffusion.engine import Engine
    from pipeline.startup import start_engine

    engine, report = start_engine(engine_options(opts))
    # its stage timings are the project's diffusion stack's (a real model: pipeline.stream_bench)
    assert isinstance(engine, Engine), "facecast bench --config times the diffusion stack"
    cfg, device = engine.cfg, engine.device
    cuda = device.type == "cuda"
    startup = report.to_dict()
    if engine.offloader is not None:
        engine.offloader.stats.stalls.clear()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)

    clock = Clock(device)
    recorder = StageRecorder(clock)
    r = cfg.diffusion.vae.temporal_ratio
    chunk_frames = cfg.schedule.chunk_latents * r
    chunk_seconds = chunk_frames / cfg.video.fps
    steps = 1 + max(1, round(opts.seconds / chunk_seconds))
    audio = speech_like_audio(steps * chunk_seconds + 2.0, opts.seed)

    t = time.perf_counter()
    session = engine.new_stream(test_card(cfg.video.height, cfg.video.width), seed=opts.seed)
    clock.sync()
    init_s = time.perf_counter() - t
    recorder.install(session)

    walls, frames_per_step, mem_10s = [], [], None
    pushed = 0
    for k in range(steps):
        recorder.chunk = k
        need = session.context.audio_window(session.plan.n_chunk(k))[1]
        t = time.perf_counter()
        session.push_audio(audio[pushed:need])
        pushed = need
        batches = session.generate_ready()
        walls.append(time.perf_counter() - t)
        frames_per_step.append(sum(len(b.frames) for b in batches))
        if cuda and mem_10s is None and session.frames_emitted >= 10 * cfg.video.fps:
            mem_10s = torch.cuda.max_memory_allocated(device)
    mem_end = torch.cuda.max_memory_allocated(device) if cuda else None
    reserved_end = torch.cuda.max_memory_reserved(device) if cuda else None
    clock.sync()

    stage_pipeline = _stage_times(recorder, clock, steps)
    steady = list(range(2, steps)) or [steps - 1]
    steady_walls = [walls[k] for k in steady]
    steady_frames = sum(frames_per_step[k] for k in steady)
    isolated, flops = _isolated_and_flops(recorder, engine, clock, opts, steady[-1])
    per_chunk_iso = sum(isolated.values())
    wall_med = statistics.median(steady_walls)
    stage_med = {s: statistics.median(v[k] for k in steady) for s, v in stage_pipeline.items()}

    result = {
        "meta": _meta(opts, engine, device),
        "startup": startup,
        "init_seconds": init_s,
        "ttff": {
            "seconds": walls[0],
            "frames": frames_per_step[0],
            "by_stage": {s: v[0] for s, v in stage_pipeline.items()},
            "first_chunk_audio_seconds": session.context.audio_window(session.plan.n_chunk(0))[1]
            / MODEL_RATE,
        },
        "steady": {
            "chunks": len(steady),
            "chunk_frames": chunk_frames,
            "chunk_seconds": chunk_seconds,
            "fps": steady_frames / sum(steady_walls),
            "real_time_factor": sum(steady_walls) / (steady_frames / cfg.video.fps),
            "chunk_wall_p50": percentile(steady_walls, 50),
            "chunk_wall_p99": percentile(steady_walls, 99),
            "chunk_wall_max": max(steady_walls),
            "p99_over_duration": percentile(steady_walls, 99) / chunk_seconds,
        },
        "stages": {
            "pipeline_seconds_per_chunk": stage_med,
            "isolated_seconds_per_chunk": isolated,
            "pipeline_efficiency": per_chunk_iso / wall_med,
            "gpu_busy_fraction": sum(stage_med.values()) / wall_med,
        },
        "memory": {
            "peak_after_10s_bytes": mem_10s,
            "peak_end_bytes": mem_end,
            "reserved_end_bytes": reserved_end,
            "end_over_10s": (mem_end / mem_10s) if (mem_10s and mem_end) else None,
            "video_seconds": session.frames_emitted / cfg.video.fps,
        },
        "switch": _switch_overhead(recorder, clock, steady, engine),
        "flops": flops_report(flops, isolated, stage_med, wall_med, steps, chunk_frames),
        "first_chunk_floor_seconds": None,
    }
    session.close()
    first_flops = flops.get("first_chunk_total")
    if first_flops:
        result["first_chunk_floor_seconds"] = first_flops / H200_BF16_PEAK
    result["weights"] = _weights_report(engine)
    return result


def _stage_times(recorder: StageRecorder, clock: Clock, steps: int) -> dict[str, list[float]]:
    out = {s: [0.0] * steps for s in STAGES}
    for c in recorder.calls:
        out[c.stage][c.chunk] += clock.seconds(c.start, c.end)
    return out


def _isolated_and_flops(recorder, engine, clock, opts, chunk: int):
    """Replay the calls of one steady chunk alone: median time per call, and their FLOPs."""
    calls = [c for c in recorder.calls if c.chunk == chunk]
    first = [c for c in recorder.calls if c.chunk == 0]
    iso = {s: 0.0 for s in STAGES}
    flops: dict = {"per_call": [], "by_stage": {s: 0 for s in STAGES}}
    cache: dict[tuple, float] = {}
    for c in calls:
        fn, args = recorder.replay[(c.stage, c.key)]
        if (c.stage, c.key) not in cache:
            cache[(c.stage, c.key)] = _time_call(fn, args, clock, opts.isolated_reps)
        iso[c.stage] += cache[(c.stage, c.key)]
    if opts.count_flops:
        counted: dict[tuple, dict] = {}
        for c in calls + first:
            if (c.stage, c.key) not in counted:
                fn, args = recorder.replay[(c.stage, c.key)]
                counted[(c.stage, c.key)] = count_call_flops(fn, args, engine)
        for c in calls:
            f = counted[(c.stage, c.key)]
            flops["by_stage"][c.stage] += f["matmul_conv"] + f["attention"]
            flops["per_call"].append({"stage": c.stage, "key": str(c.key), **f})
        flops["first_chunk_total"] = sum(sum(counted[(c.stage, c.key)].values()) for c in first)
    return iso, flops


def _time_call(fn, args, clock: Clock, reps: int) -> float:
    fn(*args)  # warm (the pipeline already ran this shape; this re-primes caches)
    times = []
    for _ in range(max(1, reps)):
        clock.sync()
        a = clock.mark()
        fn(*args)
        b = clock.mark()
        times.append(clock.seconds(a, b))
    return statistics.median(times)


def _switch_overhead(recorder, clock, steady, engine) -> dict:
    """GPU idle between consecutive stage calls of a chunk, by transition."""
    gaps: dict[str, list[float]] = {}
    for k in steady:
        calls = [c for c in recorder.calls if c.chunk == k]
        for prev, cur in zip(calls, calls[1:], strict=False):
            gaps.setdefault(f"{prev.stage}->{cur.stage}", []).append(
                max(0.0, clock.seconds(prev.end, cur.start))
            )
    out = {
        "idle_gap_seconds": {
            name: {"median": statistics.median(v), "max": max(v)} for name, v in gaps.items()
        },
        # every transition hands the GPU from one model to another
        "model_switch_max_seconds": max((max(v) for v in gaps.values()), default=0.0),
    }
    off = engine.offloader
    if off is not None and off.stats.stalls:
        stalls: dict[str, list[float]] = {}
        for s in off.stats.stalls:
            stalls.setdefault(s.stack, []).append(s.before.elapsed_time(s.after) / 1e3)
        out["offload"] = {
            "stall_seconds_total": {k: sum(v) for k, v in stalls.items()},
            "stall_seconds_first_block": {
                k: max(
                    (
                        x.before.elapsed_time(x.after) / 1e3
                        for x in off.stats.stalls
                        if x.stack == k and x.block == 0
                    ),
                    default=0.0,
                )
                for k in stalls
            },  # fmt: skip
            "loads": off.stats.loads,
            "evictions": off.stats.evictions,
            "bytes_copied": off.stats.bytes_copied,
            "host_bytes": off.host_bytes(),
            "budget_bytes": off.budget,
            "prefetch": off.cfg.prefetch,
        }
    return out


def _weights_report(engine) -> dict:
    out = {}
    for name, m in engine.modules.items():
        n = m.num_parameters()
        out[name] = {"parameters": n, "bytes": n * torch.finfo(m.dtype).bits // 8}
    return out


def _meta(opts: BenchOptions, engine, device: torch.device) -> dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": gpu or "cpu",
        "torch": torch.__version__,
        "commit": git_commit(),
        "config": engine.cfg.name,
        "attention": engine.cfg.runtime.attention,
        "dtype": engine.cfg.runtime.dtype,
        "options": asdict(opts),
        "offload": engine.offloader is not None,
        "precision": opts.precision,
    }
