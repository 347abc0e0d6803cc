"""The streaming benchmark: where the time, FLOPs and memory of a session go.

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
`schedule.chunk_latents * vae.temporal_ratio` video frames (0.96 s for rt720).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from pipeline.clock import MODEL_RATE

log = logging.getLogger("facecast.bench")

H200_BF16_PEAK = 784e12  # FLOP/s, measured (DESIGN.md §7)
H200_HBM_BYTES = 4.18e12  # B/s device copy, measured
H200_H2D_PINNED = 55.5e9  # B/s pinned host → device, measured
STAGES = ("context", "a2v", "sr", "decode")
RESULTS_HEADER = "# Facecast benchmark results\n"
SECTION_BEGIN = "<!-- facecast-bench:begin -->"
SECTION_END = "<!-- facecast-bench:end -->"


@dataclass
class BenchOptions:
    config: str = "rt720"
    seconds: float = 20.0  # seconds of video to stream after the first chunk
    device: str = "auto"
    attention: str | None = None  # override runtime.attention (sdpa, flex, facecast)
    compile: bool = False
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


# -- input ------------------------------------------------------------------------------------
def speech_like_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """Syllable-rate (~4 Hz) bursts of a voiced source (110–220 Hz harmonics with formant-like
    peaks) and some noise, with pauses: what a speech front end sees, without any speech file."""
    rng = np.random.default_rng(seed)
    n = int(seconds * MODEL_RATE)
    t = np.arange(n) / MODEL_RATE
    pitch = 150 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / MODEL_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    formants = 1 + 0.5 * np.sin(2 * np.pi * 3.1 * t) * np.sin(phase * 4)
    envelope = np.clip(np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6)), 0, None) ** 2
    pauses = (np.sin(2 * np.pi * 0.23 * t) > -0.6).astype(np.float64)
    noise = 0.05 * rng.standard_normal(n)
    x = 0.3 * (voiced * formants / 3 + noise) * envelope * pauses
    return x.astype(np.float32)


def test_card(height: int, width: int) -> np.ndarray:
    """A face-like reference image: gradient, skin oval, eyes, mouth (deterministic)."""
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 2] = (60 + 120 * yy / height).astype(np.uint8)
    face = ((yy - height * 0.5) / (height * 0.35)) ** 2 + (
        (xx - width * 0.5) / (width * 0.22)
    ) ** 2 < 1
    img[face] = (220, 180, 150)
    for ex in (0.43, 0.57):
        eye = ((yy - height * 0.42) ** 2 + (xx - width * ex) ** 2) < (height * 0.03) ** 2
        img[eye] = (30, 30, 40)
    mouth = (np.abs(yy - height * 0.65) < height * 0.02) & (np.abs(xx - width * 0.5) < width * 0.06)
    img[mouth] = (150, 40, 50)
    return img


# -- timing -----------------------------------------------------------------------------------
class Clock:
    """CUDA events on a GPU (no host sync while recording), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


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


def gpu_median_ms(fn, repeats: int, warmup: int = 3):
    """(median milliseconds of `fn()` between CUDA events, its last result), after `warmup`
    calls (compilation, autotuners, caches)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# -- FLOPs ------------------------------------------------------------------------------------
def count_call_flops(fn, args, engine) -> dict[str, int]:
    """FLOPs of one stage call: matmuls/convs counted by FlopCounterMode, attention useful
    FLOPs from its shapes and mask (FlopCounterMode would count masked attention as dense and
    cannot see Triton kernels). Attention itself is stubbed out while counting: its count
    does not depend on values, and an eager FlexAttention would materialise the scores."""
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.kernels.frame_mask import FrameWindowSpec, frame_window_flops
    from pipeline.models.attention import Attention

    attn_flops = [0]

    def counted_attention(self, q, k, v, window=None):
        B, N, L, H = q.shape
        spec = (
            None
            if window is None
            else FrameWindowSpec(window.tokens_per_frame, window.window, window.ref_frames)
        )
        attn_flops[0] += frame_window_flops(B, N, L, H, spec)
        return v.clone()

    counter = FlopCounterMode(display=False)
    with mock.patch.object(Attention, "forward", counted_attention), _force_eager(), counter:
        fn(*args)
    total = 0
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        name = str(op)
        if "scaled_dot_product" in name or "flex_attention" in name:
            continue  # counted above as useful FLOPs
        total += n
    return {"matmul_conv": int(total), "attention": int(attn_flops[0])}


def _force_eager():
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:
        import contextlib

        return contextlib.nullcontext()
    return stance("force_eager")


# -- the run ----------------------------------------------------------------------------------
def engine_options(opts: BenchOptions):
    """The benchmark's engine, started like every command's (`pipeline.startup`)."""
    from pipeline.startup import EngineOptions

    return EngineOptions(
        config=opts.config,
        device=opts.device,
        attention=opts.attention,
        compile=opts.compile,
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
        "flops": _flops_report(flops, isolated, stage_med, wall_med, steps, chunk_frames),
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


def _flops_report(flops, isolated, stage_med, wall_med, steps, chunk_frames) -> dict:
    by = flops.get("by_stage", {})
    total = sum(by.values())
    rep = {
        "per_chunk_by_stage": by,
        "per_chunk_total": total,
        "per_call": flops.get("per_call", []),
        "first_chunk_total": flops.get("first_chunk_total"),
    }
    if total:
        rep["achieved_tflops_pipeline"] = {
            s: by[s] / stage_med[s] / 1e12 for s in by if stage_med.get(s)
        }
        rep["achieved_tflops_isolated"] = {
            s: by[s] / isolated[s] / 1e12 for s in by if isolated.get(s)
        }
        rep["fraction_of_peak_isolated"] = {
            s: by[s] / isolated[s] / H200_BF16_PEAK for s in by if isolated.get(s)
        }
        rep["chunk_tflops"] = total / wall_med / 1e12
        rep["chunk_fraction_of_peak"] = total / wall_med / H200_BF16_PEAK
        rep["compute_floor_seconds_per_chunk"] = total / H200_BF16_PEAK
        rep["fps_ceiling_at_peak"] = chunk_frames / (total / H200_BF16_PEAK)
    return rep


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


def git_commit() -> str:
    """The commit measured: FACECAST_COMMIT where the tree was copied without its history
    (the lent GPU machine), else git's."""
    if os.environ.get("FACECAST_COMMIT"):
        return os.environ["FACECAST_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "pipeline"], capture_output=True,
                               text=True).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# -- reporting --------------------------------------------------------------------------------
def summary_line(res: dict) -> str:
    s, t, m = res["steady"], res["ttff"], res["memory"]
    gb = lambda b: f"{b / 1e9:.2f}" if b else "-"  # noqa: E731
    return (
        f"{res['meta']['config']} attn={res['meta']['attention']} "
        f"offload={res['meta']['offload']}: ttff {t['seconds']:.3f}s, {s['fps']:.1f} fps, "
        f"RTF {s['real_time_factor']:.3f}, p99 chunk {s['chunk_wall_p99']:.3f}s "
        f"({s['p99_over_duration']:.2f}x), eff {res['stages']['pipeline_efficiency']:.3f}, "
        f"mem10s {gb(m['peak_after_10s_bytes'])} GB end {gb(m['peak_end_bytes'])} GB, "
        f"{res['flops'].get('chunk_tflops', 0):.0f} TFLOP/s"
    )


def markdown_rows(res: dict, command: str) -> str:
    s, t, m, st = res["steady"], res["ttff"], res["memory"], res["stages"]
    fl, sw, meta = res["flops"], res["switch"], res["meta"]
    gb = lambda b: f"{b / 1e9:.2f}" if b else "–"  # noqa: E731
    lines = [
        f"### {meta['config']} · attention={meta['attention']} · compile="
        f"{meta['options']['compile']} · offload={meta['offload']}",
        "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · commit `{meta['commit']}`",
        f"`{command}`",
        "",
        "| metric | value |",
        "| --- | --- |",
        f"| time to first frame | {t['seconds'] * 1e3:.0f} ms ("
        + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in t["by_stage"].items())
        + f" ms GPU); init {res['init_seconds'] * 1e3:.0f} ms; startup "
        f"{res['startup'].get('startup_seconds', 0):.1f} s |",
        f"| steady fps / RTF | {s['fps']:.1f} fps / {s['real_time_factor']:.3f} |",
        f"| chunk wall p50 / p99 (duration {s['chunk_seconds']:.2f} s) | "
        f"{s['chunk_wall_p50']:.3f} / {s['chunk_wall_p99']:.3f} s "
        f"({s['p99_over_duration']:.2f}×) |",
        "| stage s/chunk pipeline · isolated | "
        + ", ".join(
            f"{k} {st['pipeline_seconds_per_chunk'][k]:.3f}·{st['isolated_seconds_per_chunk'][k]:.3f}"
            for k in STAGES
        )
        + " |",
        f"| pipeline efficiency | {st['pipeline_efficiency']:.3f} |",
        f"| peak GPU memory 10 s / end | {gb(m['peak_after_10s_bytes'])} / "
        f"{gb(m['peak_end_bytes'])} GB over {m['video_seconds']:.0f} s of video |",
        f"| max model-switch idle | {sw['model_switch_max_seconds'] * 1e3:.2f} ms |",
    ]
    if "offload" in sw:
        o = sw["offload"]
        lines.append(
            "| offload stalls per run | "
            + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in o["stall_seconds_total"].items())
            + f"; {o['bytes_copied'] / 1e9:.0f} GB copied |"
        )
    if fl.get("per_chunk_total"):
        lines.append(
            "| FLOPs/chunk (TFLOP) | "
            + ", ".join(f"{k} {v / 1e12:.1f}" for k, v in fl["per_chunk_by_stage"].items())
            + f" = {fl['per_chunk_total'] / 1e12:.1f} |"
        )
        lines.append(
            "| achieved TFLOP/s isolated (of 784) | "
            + ", ".join(f"{k} {v:.0f}" for k, v in fl["achieved_tflops_isolated"].items())
            + f"; whole chunk {fl['chunk_tflops']:.0f} ({fl['chunk_fraction_of_peak']:.2f}) |"
        )
        lines.append(
            f"| compute floor | {fl['compute_floor_seconds_per_chunk']:.3f} s/chunk → "
            f"{fl['fps_ceiling_at_peak']:.1f} fps at 784 TFLOP/s |"
        )
    return "\n".join(lines) + "\n"


def write_results(res: dict, json_path: str | Path | None, command: str, md: Path | None) -> None:
    if json_path:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"command": command, **res}, indent=2, default=str))
    if md is not None:
        append_markdown(md, markdown_rows(res, command))


def append_markdown(path: Path, block: str) -> None:
    """Add a block to this benchmark's own section of RESULTS.md (other sections untouched)."""
    text = path.read_text() if path.exists() else RESULTS_HEADER
    if SECTION_BEGIN not in text:
        text = text.rstrip("\n") + (
            f"\n\n## Streaming pipeline (`facecast bench`)\n\n{SECTION_BEGIN}\n{SECTION_END}\n"
        )
    head, rest = text.split(SECTION_BEGIN, 1)
    body, tail = rest.split(SECTION_END, 1)
    body = body.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + SECTION_BEGIN + body + "\n" + SECTION_END + tail)
