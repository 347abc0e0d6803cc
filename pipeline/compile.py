"""Compilation and kernel choice, applied to a loaded engine from outside the model code.

- `compile_engine`: `torch.compile` per DiT block (torchtitan's habit: one small graph that
  every block of a stack shares), with dynamic token counts so the few chunk shapes
  (N_0, N, I; SR segments of 2, 3 and 5 latent frames) share one compiled graph instead of
  compiling each. Attention is excluded from the graphs on purpose (`Attention.forward` is
  `torch.compiler.disable`d): its kernels are picked per shape below, or are our own.
  What the graphs buy is fusion of the memory-bound glue around the matmuls: LayerNorm +
  adaLN modulate, RoPE (done in fp32), gates and residual adds, GELU.
  Only the block's `forward` is compiled, not `__call__`, so the offload manager's
  pre-hooks (stream waits, weight binding) stay outside the graph.
  On a GPU the VAE decoder's forward is compiled too: its GroupNorm, SiLU, upsampling and
  cache concatenations are memory-bound around cuDNN's convolutions, and fused they took
  a 720p step's decode from 38 to 15 ms on the H200 (bench/decode_bench.py).
- `pick_sdpa_backends`: times every SDPA backend on each unmasked attention shape the A2V
  DiT will see and pins the fastest one per shape.

Compilation and tuning run in `Engine.warmup()`, at start-up; they are reported apart and
never count in a session's time to first frame.
"""

from __future__ import annotations

import logging
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline.diffusion.config import latent_grid
from pipeline.models.attention import Attention
from pipeline.schedule import ChunkPlan
from pipeline.warmup import Progress

log = logging.getLogger("facecast.compile")

SDPA_CANDIDATES = (
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
)


def compile_engine(engine, mode: str | None = None) -> int:
    """Compile every DiT block's forward in place; returns how many blocks were wrapped."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    # Round every fused bf16 intermediate the way eager does. Without it Inductor keeps them
    # in fp32 registers: slightly more precise, but 0.8 dB outside the quality gate's
    # reduction-order band against the eager baseline (rt720 on the H200, 47.7 vs 48.5 dB).
    import torch._inductor.config as inductor_config

    inductor_config.emulate_precision_casts = True
    count = 0
    for name in ("a2v", "sr"):
        for block in engine.modules[name].model.transformer.blocks:
            block.forward = torch.compile(block.forward, dynamic=True, mode=mode)
            count += 1
    if engine.device.type == "cuda":
        decoder = engine.modules["vae"].model.decoder
        decoder.forward = torch.compile(decoder.forward, dynamic=True, mode=mode)
    engine.compiled = True
    return count


def a2v_attention_shapes(engine) -> list[tuple[int, int, int, int]]:
    """(B, N, L, H) of the A2V DiT's attention for every chunk kind of the schedule."""
    cfg = engine.cfg
    plan = ChunkPlan(cfg.schedule)
    g = latent_grid(cfg)
    _, ph, pw = cfg.diffusion.a2v.patch
    per_frame = (g.low_h // ph) * (g.low_w // pw)
    heads, head_dim = cfg.diffusion.a2v.heads, cfg.diffusion.a2v.dim // cfg.diffusion.a2v.heads
    lengths = {plan.n_chunk(0).length, plan.n_chunk(1).length}
    if plan.w:
        lengths.add(plan.i_chunk(0).length)
    return [(1, heads, (1 + t) * per_frame, head_dim) for t in sorted(lengths)]


def time_sdpa(shape, backend: SDPBackend, dtype, device, reps: int = 10) -> float | None:
    """Median seconds of one SDPA call with this backend, or None where it does not run."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    try:
        with sdpa_kernel([backend]):
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
    except RuntimeError as exc:  # backend does not support this shape/dtype here
        log.info("sdpa %s unavailable for %s: %s", backend, shape, str(exc).splitlines()[0])
        return None
    return sorted(times)[len(times) // 2]


def pick_sdpa_backends(engine) -> dict[tuple[int, ...], dict]:
    """Pin the fastest SDPA backend for each A2V attention shape; returns the timings."""
    if engine.device.type != "cuda":
        return {}
    dtype = engine.modules["a2v"].dtype
    report: dict[tuple[int, ...], dict] = {}
    choice: dict[tuple[int, ...], SDPBackend] = {}
    for shape in a2v_attention_shapes(engine):
        timings = {b.name: time_sdpa(shape, b, dtype, engine.device) for b in SDPA_CANDIDATES}
        ok = {name: t for name, t in timings.items() if t is not None}
        best = min(ok, key=lambda name: ok[name])
        choice[shape] = next(b for b in SDPA_CANDIDATES if b.name == best)
        report[shape] = {"seconds": timings, "chosen": best}
    for module in engine.modules["a2v"].model.modules():
        if isinstance(module, Attention):
            module.sdpa_backends.update(choice)
    return report


def prepare(
    engine, compile_blocks: bool = False, sdpa_pick: bool = True, progress: Progress | None = None
) -> dict:
    """Everything start-up does before serving: pick kernels, compile, warm up. Timed."""
    out: dict = {}
    t = time.perf_counter()
    if sdpa_pick:
        out["sdpa"] = {str(k): v for k, v in pick_sdpa_backends(engine).items()}
    if compile_blocks:
        out["compiled_blocks"] = compile_engine(engine)
    out["warmup_seconds"] = engine.warmup(progress=progress)
    out["startup_seconds"] = time.perf_counter() - t
    return out
