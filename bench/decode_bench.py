"""GPU benchmark of the decode stage: the causal VAE decoder's convolution layouts.

The decode stage is a few TFLOP a step but ran at 36-40 TFLOP/s on the H200 (11-12% of a
720p step), memory-bound in cuDNN's channels-first Conv3d. This script streams a config's
decoder over its serving schedule's chunks (first chunk, then steady ones, the causal cache
carried) in each variant and reports milliseconds per steady step, peak memory, and how the
frames differ from the first variant (uint8, max and share of differing values):

- `ncdhw`: what the engine runs (cuDNN Conv3d on channels-first activations);
- `ndhwc`: the same convs on channels-last-3D activations and weights;
- `stacked2d`: each causal conv as one 2D conv over the kt-frame channel stack (the CPU path);
- `compile`/`ndhwc-compile`: the decoder's forward under torch.compile.

It also times the frames' trip to the host: the permuted tensor copied as it is (a strided
host array that every consumer then transposes) against a contiguous copy made on the GPU.

    python bench/decode_bench.py --config rt720-low-latency --json bench/results/decode_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import load_config  # noqa: E402
from pipeline.diffusion.build import build_models, module_dtype  # noqa: E402
from pipeline.diffusion.config import latent_grid  # noqa: E402
from pipeline.diffusion.vae import CausalConv3d, Decoder  # noqa: E402

VARIANTS = ("ncdhw", "ndhwc", "stacked2d", "compile", "ndhwc-compile")


def _stacked_forward(self, x_BCTHW, cache):
    if cache is None:
        cache = x_BCTHW[:, :, :1].expand(-1, -1, self.kt - 1, -1, -1)
    x = torch.cat([cache, x_BCTHW], dim=2)
    return self._conv_as_2d(x), x[:, :, -(self.kt - 1) :].detach()


def to_channels_last(decoder: Decoder) -> None:
    for m in decoder.modules():
        if isinstance(m, torch.nn.Conv3d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
        elif isinstance(m, torch.nn.Conv2d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)


def make_decoder(cfg, variant: str, device) -> tuple[Decoder, object]:
    vae = build_models(cfg, device, only=("vae",))["vae"]
    vae = vae.to(device=device, dtype=module_dtype(cfg, "vae")).eval().requires_grad_(False)
    dec = vae.decoder
    if variant.startswith("ndhwc"):
        to_channels_last(dec)
    if variant == "stacked2d":
        for m in dec.modules():
            if isinstance(m, CausalConv3d):
                m.forward = types.MethodType(_stacked_forward, m)
    forward = dec.forward
    if variant.endswith("compile"):
        forward = torch.compile(dec.forward, dynamic=False)
    return dec, forward


def run_variant(cfg, variant: str, latents: list[torch.Tensor], device) -> dict:
    _, forward = make_decoder(cfg, variant, device)
    h, w = cfg.video.height, cfg.video.width
    channels_last = variant.startswith("ndhwc")

    def stream(keep: bool) -> tuple[list[np.ndarray], list[float]]:
        cache, frames, times = None, [], []
        for z in latents:
            if channels_last:
                z = z.contiguous(memory_format=torch.channels_last_3d)
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.inference_mode():
                y, cache = forward(z, cache)
                rgb = ((y[0, :, :, :h, :w].float().clamp(-1, 1) + 1) * 127.5).round()
                rgb = rgb.to(torch.uint8).permute(1, 2, 3, 0).contiguous().cpu().numpy()
            times.append(time.perf_counter() - t)
            if keep:
                frames.append(rgb)
        return frames, times

    torch.cuda.reset_peak_memory_stats()
    stream(keep=False)  # compile, cuDNN plans
    stream(keep=False)
    frames, times = stream(keep=True)
    steady = sorted(times[1:])
    return {
        "variant": variant,
        "first_ms": times[0] * 1e3,
        "steady_ms_median": steady[len(steady) // 2] * 1e3,
        "steady_ms_min": steady[0] * 1e3,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
        "_frames": frames,
    }


def host_copy_ms(cfg, frames: int, device, reps: int = 5) -> dict:
    """The frames' trip to the host: permuted (strided) as the engine did, or contiguous."""
    h, w = cfg.video.height, cfg.video.width
    x = torch.randint(0, 255, (3, frames, h, w), dtype=torch.uint8, device=device)
    out = {}
    for name in ("strided_then_transpose", "contiguous_on_gpu"):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            if name == "strided_then_transpose":
                a = np.ascontiguousarray(x.permute(1, 2, 3, 0).cpu().numpy())
            else:
                a = x.permute(1, 2, 3, 0).contiguous().cpu().numpy()
            ts.append(time.perf_counter() - t)
        assert a.flags.c_contiguous
        out[name] = sorted(ts)[reps // 2] * 1e3
    return out


def conv_flops(cfg, latents: int) -> float:
    """Multiply-adds x2 of the decoder's convolutions for `latents` latent frames."""
    g = latent_grid(cfg)
    r, chans = cfg.diffusion.vae.temporal_ratio, list(reversed(cfg.diffusion.vae.channels))
    h, w, frames = g.full_h, g.full_w, latents
    total = 2 * frames * h * w * 3 * 9 * cfg.diffusion.vae.latent_channels * chans[0]  # conv_in
    frames *= r
    for i, c in enumerate(chans):
        c_next = chans[min(i + 1, len(chans) - 1)]
        total += cfg.diffusion.vae.res_blocks * 2 * (2 * frames * h * w * 27 * c * c)
        h, w = 2 * h, 2 * w
        total += 2 * frames * h * w * 9 * c * c_next
    total += 2 * frames * h * w * 9 * chans[-1] * 3
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="rt720-low-latency")
    parser.add_argument("--steps", type=int, default=8, help="steady steps after the first")
    parser.add_argument("--variant", action="append", choices=VARIANTS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    cfg = load_config(args.config)
    g = latent_grid(cfg)
    first, steady = cfg.schedule.first_chunk_latents, cfg.schedule.chunk_latents
    gen = torch.Generator(device="cpu").manual_seed(0)
    dtype = module_dtype(cfg, "vae")
    latents = [
        torch.randn(1, cfg.diffusion.vae.latent_channels, n, g.full_h, g.full_w, generator=gen).to(
            device, dtype
        )
        for n in [first] + [steady] * args.steps
    ]
    flops = conv_flops(cfg, steady)
    results, reference = [], None
    for variant in args.variant or VARIANTS:
        try:
            r = run_variant(cfg, variant, latents, device)
        except Exception as exc:  # a variant that does not run here is reported, not fatal
            results.append({"variant": variant, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(f"{variant}: {results[-1]['error']}", flush=True)
            continue
        frames = r.pop("_frames")
        if reference is None:
            reference = frames
        diff = [np.abs(a.astype(np.int16) - b) for a, b in zip(frames, reference, strict=True)]
        r["max_diff"] = int(max(d.max() for d in diff))
        r["share_differing"] = float(np.mean([(d > 0).mean() for d in diff]))
        r["tflops"] = flops / (r["steady_ms_median"] / 1e3) / 1e12
        results.append(r)
        print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
    copy = host_copy_ms(cfg, steady * cfg.diffusion.vae.temporal_ratio, device)
    print("host copy ms:", json.dumps(copy), flush=True)
    report = {
        "config": args.config,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "steady_latents": steady,
        "conv_tflop_per_step": flops / 1e12,
        "variants": results,
        "host_copy_ms": copy,
        "command": "python " + " ".join(sys.argv),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
