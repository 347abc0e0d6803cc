"""Time LiveAvatar's S2V transformer block by block on one GPU, at the release's shape.

    python bench/liveavatar_block_bench.py [--size 704x384] [--blocks 6] [--steps 4]
        [--layers 40] [--attention sdpa,cudnn,int8,fp8] [--json OUT] [--device cuda|cpu]

Random weights (drawn on the GPU: only the shapes matter here), bf16. It does what a
stream does: prefill (prompt + sink), then per block (3 latent frames = 12 video frames,
0.48 s of video at 25 fps) the audio encoding and `steps` forwards, each on its step's KV
cache, the cache rolling past its 12-frame window after block 4. Prints the prefill time,
the forward and block latency (median of the blocks after the first), the achieved TFLOP/s
(matrix products counted), the cache's size and the peak memory, and how far from real
time one GPU is. `--device cpu` (with a small `--size` and `--layers`) only checks that it
runs: its times are host times.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.clock import FPS  # noqa: E402 (wan_s2v samples at the same rate)
from pipeline.models.attention import Attention  # noqa: E402
from pipeline.models.wan.s2v import S2VConfig, S2VTransformer  # noqa: E402


class HostMark:
    """`torch.cuda.Event`'s two methods on the host clock (the CPU check)."""

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: HostMark) -> float:
        return (end.t - self.t) * 1e3


def random_on_device(model: S2VTransformer, seed: int) -> None:
    """Role-shaped random values, as s2v_weights.random_published_state draws them."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("audio_encoder.weights") or (p.ndim == 1 and "norm" in name):
                p.normal_(1.0, 0.1)
            elif name.endswith("modulation"):
                p.normal_(0.0, p.shape[-1] ** -0.5)
            elif p.ndim == 1:
                p.normal_(0.0, 0.02)
            else:
                p.normal_(0.0, math.prod(p.shape[1:]) ** -0.5)


def layers_config(layers: int) -> S2VConfig:
    """The release's transformer cut to its first `layers` layers (the audio injected only
    into those of them that have it)."""
    full = S2VConfig()
    return S2VConfig(
        num_layers=layers,
        audio_inject_layers=tuple(i for i in full.audio_inject_layers if i < layers),
    )


def forward_flops(cfg: S2VConfig, tokens: int, keys: int) -> float:
    """Matrix-product FLOPs of one block forward (the rest is noise at this size)."""
    d, f, m = cfg.dim, cfg.ffn_dim, cfg.text_len
    per_layer = 2 * tokens * (4 * d * d + 2 * d * f)  # qkv, o, ffn
    per_layer += 2 * tokens * 2 * d * d  # text cross-attention's q, o (its k, v: at prefill)
    per_layer += 4 * tokens * d * (keys + m)  # the two attentions' QK and PV
    audio = len(cfg.audio_inject_layers) * 2 * tokens * 4 * d * d  # q, o, adain (small)
    return cfg.num_layers * per_layer + audio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="704x384", help="video height x width in pixels")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--attention", default="sdpa", help="comma-separated kernels, each timed")
    p.add_argument("--json")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dev = torch.device(a.device)
    cfg = layers_config(a.layers)
    with torch.device("meta"):
        model = S2VTransformer(cfg).to(torch.bfloat16)
    model.to_empty(device=dev)  # allocated in bf16 at once: 33 GB, not 65 then 33
    random_on_device(model, 0)
    model = model.eval().requires_grad_(False)
    reports = [run_blocks(model, cfg, a, dev, kernel) for kernel in a.attention.split(",")]
    if a.json:
        Path(a.json).write_text(json.dumps(reports if len(reports) > 1 else reports[0], indent=1))


SDPA_KERNELS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def run_blocks(model: S2VTransformer, cfg: S2VConfig, a, dev: torch.device, kernel: str) -> dict:
    """Prefill and `a.blocks` blocks on a fresh cache, every attention through `kernel`."""
    for m in model.modules():
        if isinstance(m, Attention):
            m.backend = kernel if kernel in ("int8", "fp8") else "sdpa"
    context = sdpa_kernel([SDPA_KERNELS[kernel]]) if kernel in SDPA_KERNELS else nullcontext()
    with context:
        return _run_blocks(model, cfg, a, dev, kernel)


def _run_blocks(model: S2VTransformer, cfg: S2VConfig, a, dev: torch.device, kernel: str) -> dict:
    cuda = dev.type == "cuda"

    def mark():
        return torch.cuda.Event(enable_timing=True) if cuda else HostMark()

    height, width = (int(v) for v in a.size.split("x"))
    H, W = height // 8, width // 8
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    fpb = cfg.frames_per_block
    g = torch.Generator(device=dev).manual_seed(1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.bfloat16)

    cache = model.new_cache(1, (H, W), a.steps, dev, torch.bfloat16)
    sigmas = torch.linspace(1.0, 0.0, a.steps + 1, device=dev)
    events = []
    with torch.inference_mode():
        t0, t1 = mark(), mark()
        t0.record()
        model.prefill(
            cache, randn(1, 40, cfg.text_dim), randn(1, 16, 1, H, W), randn(1, 16, 19, H, W)
        )
        t1.record()
        for _ in range(a.blocks):
            marks = [mark() for _ in range(a.steps + 2)]
            marks[0].record()
            audio = model.encode_audio(randn(1, cfg.audio_layers, cfg.audio_dim, 4 * fpb))
            marks[1].record()
            x = randn(1, 16, fpb, H, W)
            for i in range(a.steps):
                v = model.forward_block(x, 1000 * sigmas[i : i + 1], audio, cache, i)
                x = x + (sigmas[i + 1] - sigmas[i]) * v
                marks[i + 2].record()
            cache.advance()
            events.append(marks)
        if cuda:
            torch.cuda.synchronize()  # every event above has completed: read them
    prefill_ms = t0.elapsed_time(t1)
    fwd = [m[i + 2].elapsed_time(m[i + 3]) for m in events[1:] for i in range(a.steps - 1)]
    fwd += [m[1].elapsed_time(m[2]) for m in events[1:]]
    block_ms = statistics.median(m[0].elapsed_time(m[-1]) for m in events[1:])
    audio_ms = statistics.median(m[0].elapsed_time(m[1]) for m in events[1:])
    forward_ms = statistics.median(fwd)
    tokens = cache.block_tokens
    keys = cache.sink_tokens + cache.slots * tokens  # once the window is full
    tflops = forward_flops(cfg, tokens, keys) / (forward_ms / 1e3) / 1e12
    video_s = 4 * fpb / FPS
    report = {
        "attention": kernel,
        "size": a.size,
        "layers": a.layers,
        "steps": a.steps,
        "tokens_per_block": tokens,
        "sink_tokens": cache.sink_tokens,
        "prefill_ms": prefill_ms,
        "audio_ms": audio_ms,
        "forward_ms": forward_ms,
        "block_ms": block_ms,
        "tflops": tflops,
        "video_s_per_block": video_s,
        "realtime_factor": video_s / (block_ms / 1e3),
        "cache_gb": cache.nbytes() / 1e9,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
    }
    print(
        f"{kernel}: {a.size} {a.layers} layers, {a.steps} steps: prefill {prefill_ms:.0f} ms, audio "
        f"{audio_ms:.1f} ms, forward {forward_ms:.1f} ms ({tflops:.0f} TFLOP/s), block "
        f"{block_ms:.0f} ms for {video_s:.2f} s of video (x{report['realtime_factor']:.2f} "
        f"real time), cache {report['cache_gb']:.1f} GB, peak {report['peak_gb'] or 0:.1f} GB"
    )
    return report


if __name__ == "__main__":
    main()
