"""Multi-GPU benchmark: one session's DiT stages over N ranks (Ulysses + optional FSDP2).

For each world size given, it measures per-forward time of the A2V DiT (one sampler step
on an N chunk) and the SR DiT (one emitted segment with its window context), for several
Ulysses head-group counts G, and the same forwards with the all-to-alls replaced by local
copies (same compute, no transfer): the difference is the all-to-all time left exposed.
Then it runs a streaming session for `--seconds` of speech-like audio and reports time to
first frame and fps. Results: one JSON per world size, and a markdown table on stdout.

    python bench/parallel_bench.py --config avatar-iv-scale --world 2 --groups 1 2 4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from pipeline.clock import MODEL_RATE, MODEL_SAMPLES_PER_FRAME, model_samples
from pipeline.config import load_config
from pipeline.diffusion.config import latent_grid
from pipeline.diffusion.engine import Engine
from pipeline.parallel import ulysses
from pipeline.parallel.launch import ParallelOptions, launch, parallelize_engine


def speechy_audio(seconds: float) -> np.ndarray:
    t = np.arange(model_samples(seconds)) / MODEL_RATE
    env = (np.sin(2 * np.pi * 2.5 * t) > -0.3).astype(np.float32)
    return 0.3 * env * np.sin(2 * np.pi * 170 * t * (1 + 0.1 * np.sin(2 * np.pi * 4 * t)))


def timed(fn, warmup: int, iters: int, device) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if dist.is_initialized():
            dist.barrier()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return times


def set_head_groups(engine: Engine, groups: int) -> None:
    for name in ("a2v", "sr"):
        for m in engine.modules[name].model.modules():
            if isinstance(m, ulysses.UlyssesAttention):
                m.head_groups = groups


def stage_inputs(engine: Engine):
    cfg, dev, dt = engine.cfg, engine.device, engine.modules["a2v"].dtype
    g = latent_grid(cfg)
    C, r, s = cfg.diffusion.vae.latent_channels, cfg.diffusion.vae.temporal_ratio, cfg.schedule
    T = s.chunk_latents + s.boundary_latents
    gen = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, device=dev, dtype=dt, generator=gen)  # noqa: E731
    a2v_args = (
        rnd(1, C, T, g.low_h, g.low_w),
        torch.full((1,), 0.5, device=dev),
        rnd(1, C, T, g.low_h, g.low_w),
        torch.zeros(1, T, device=dev, dtype=dt),
        rnd(1, T * r, cfg.diffusion.audio.out_dim),
        rnd(1, C, 1, g.low_h, g.low_w),
    )
    Ts = s.chunk_latents + cfg.diffusion.sr.window
    sr_args = (
        rnd(1, C, Ts, g.low_h, g.low_w),
        rnd(1, C, Ts, g.full_h, g.full_w),
        rnd(1, C, 1, g.full_h, g.full_w),
    )
    return a2v_args, sr_args


def worker(rank: int, opts: ParallelOptions, args: argparse.Namespace) -> None:
    device = f"cuda:{rank}" if torch.cuda.is_available() else "cpu"
    cfg = load_config(args.config, overrides={"runtime.attention": args.attention})
    t = time.perf_counter()
    engine = Engine.load(cfg, device)
    if opts.world > 1:
        parallelize_engine(engine, opts)
    load_s = time.perf_counter() - t
    a2v, sr = engine.modules["a2v"].model, engine.modules["sr"].model
    a2v_args, sr_args = stage_inputs(engine)
    result = {
        "world": opts.world,
        "config": args.config,
        "fsdp": opts.fsdp,
        "load_s": load_s,
        "stages": {},
    }
    groups = args.groups if opts.world > 1 else [1]
    real_a2a = dist.all_to_all_single
    with torch.inference_mode():
        for G in groups:
            set_head_groups(engine, G)
            for comm in [True, False] if opts.world > 1 else [True]:
                if not comm:  # same shapes and compute; the transfer becomes a local copy

                    def local_copy(out, inp, group=None, async_op=False):
                        out.copy_(inp)
                        return _Done() if async_op else None

                    dist.all_to_all_single = local_copy
                try:
                    ta = timed(lambda: a2v(*a2v_args), args.warmup, args.iters, engine.device)
                    ts = timed(lambda: sr(*sr_args), args.warmup, args.iters, engine.device)
                finally:
                    dist.all_to_all_single = real_a2a
                key = f"G{G}" + ("" if comm else "_nocomm")
                result["stages"][key] = {
                    "a2v_s": statistics.median(ta),
                    "sr_s": statistics.median(ts),
                }
        best = min(
            groups,
            key=lambda G: result["stages"][f"G{G}"]["a2v_s"] + result["stages"][f"G{G}"]["sr_s"],
        )
        set_head_groups(engine, best)
        result["best_groups"] = best
        result["session"] = run_session(engine, args.seconds)
    if rank == 0:
        out = (
            Path(args.out)
            / f"parallel_{args.config}_w{opts.world}{'_fsdp' if opts.fsdp else ''}.json"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result), flush=True)


class _Done:
    def wait(self) -> None:
        return None


def run_session(engine: Engine, seconds: float) -> dict:
    audio = speechy_audio(seconds)
    ref = np.full((720, 1280, 3), 128, np.uint8)
    # warm-up session (kernels, allocator), then the timed one
    warm = engine.new_stream(ref, seed=1)
    warm.push_audio(audio[: model_samples(2.0)])
    warm.finish()
    warm.close()
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    if dist.is_initialized():
        dist.barrier()
    session = engine.new_stream(ref, seed=0)
    t0 = time.perf_counter()
    first = None
    frames = 0
    step = MODEL_SAMPLES_PER_FRAME * 4  # push 160 ms at a time, as fast as generation takes it
    for i in range(0, audio.size, step):
        session.push_audio(audio[i : i + step])
        for b in session.generate_ready():
            frames += len(b.frames)
            if first is None:
                first = time.perf_counter() - t0
    for b in session.finish():
        frames += len(b.frames)
    total = time.perf_counter() - t0
    session.close()
    return {"ttff_s": first, "frames": frames, "seconds": total, "fps": frames / total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="avatar-iv-scale")
    p.add_argument("--attention", default="sdpa")
    p.add_argument("--world", type=int, nargs="+", default=[1, 2])
    p.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--fsdp", action="store_true", help="also shard weights with FSDP2")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    for world in args.world:
        launch(worker, ParallelOptions(world=world, head_groups=1, fsdp=args.fsdp), args)


if __name__ == "__main__":
    main()
