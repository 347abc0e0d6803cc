"""GPU benchmark of the Wan 2.1 VAE decode of one FlashHead chunk (9 latent frames → 33 frames).

The decode was more than half of a FlashHead chunk on the H200 (0.55 s of 0.81 s, 134
TFLOP/s on 73.9 TFLOP), run one latent frame at a time as the authors run it. The decoder's
convolutions in time are causal and read their look-back from the cache, so after the
stream's first latent frame (which the temporal upsamplers treat apart) the other eight can
go through in one wide pass. This times, on random weights of the published shapes:

- `per-frame`: one pass per latent frame (the authors' schedule);
- `wide`: the first latent frame, then the other eight in one pass;
- each in channels-first (`ncdhw`) and channels-last-3D (`ndhwc`) layout, eager and under
  torch.compile, cuDNN's autotuner on;

and reports ms per chunk, TFLOP/s (FLOPs counted by torch's FlopCounterMode on the wide
pass) and each variant's largest difference from the per-frame eager pixels.

    python bench/wan_decode_bench.py --json bench/results/flashhead/wan_decode_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.models.wan.vae import WAN21_VAE, WanVAE, checkpoint_layout, random_checkpoint  # noqa: E402


def build(device: str, dtype: torch.dtype, channels_last: bool) -> WanVAE:
    vae = WanVAE(WAN21_VAE)
    layout = checkpoint_layout(WAN21_VAE)
    state = {layout[k]: v for k, v in random_checkpoint(WAN21_VAE, seed=0).items()}
    vae.load_state_dict(state, strict=True)
    vae = vae.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if channels_last:
        vae = vae.to(memory_format=torch.channels_last_3d)
    return vae


def decode(vae: WanVAE, lat: torch.Tensor, per_pass: int | None) -> torch.Tensor:
    return vae.stream().decode(lat, latents_per_pass=per_pass)


def timed(vae: WanVAE, lat: torch.Tensor, per_pass: int | None, repeats: int) -> float:
    decode(vae, lat, per_pass)  # twice: compile, then cuDNN's autotuner
    decode(vae, lat, per_pass)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        decode(vae, lat, per_pass)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=512, help="square frame side in pixels")
    p.add_argument("--latent-frames", type=int, default=9)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    dev, dtype = "cuda", torch.bfloat16
    h = args.size // 8
    gen = torch.Generator(device=dev).manual_seed(0)
    lat = torch.randn((1, 16, args.latent_frames, h, h), generator=gen, device=dev, dtype=dtype)

    rows: list[dict] = []
    baseline: torch.Tensor | None = None
    flops = 0
    with torch.inference_mode():
        for layout in ("ncdhw", "ndhwc"):
            vae = build(dev, dtype, channels_last=layout == "ndhwc")
            x = lat.to(memory_format=torch.channels_last_3d) if layout == "ndhwc" else lat
            if not flops:
                with FlopCounterMode(display=False) as counter:
                    decode(vae, x, None)
                flops = counter.get_total_flops()
            for compiled in (False, True):
                if compiled:
                    vae.net.decoder.forward = torch.compile(vae.net.decoder.forward)  # type: ignore[method-assign]
                for name, per_pass in (("per-frame", 1), ("wide", None)):
                    label = f"{name} {layout}{' compile' if compiled else ''}"
                    torch.cuda.reset_peak_memory_stats()
                    try:
                        seconds = timed(vae, x, per_pass, args.repeats)
                        out = decode(vae, x, per_pass).float()
                    except Exception as e:  # one variant failing must not hide the others
                        print(f"{label}: FAILED {type(e).__name__}: {e}", flush=True)
                        rows.append({"variant": label, "error": f"{type(e).__name__}: {e}"})
                        continue
                    if baseline is None:
                        baseline = out
                    diff = (out - baseline).abs()
                    row = {
                        "variant": label,
                        "ms": round(seconds * 1000, 1),
                        "tflops": round(flops / seconds / 1e12, 1),
                        "max_diff": round(diff.max().item(), 4),
                        "mean_diff": round(diff.mean().item(), 6),
                        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
                    }
                    rows.append(row)
                    print(row, flush=True)
            torch.cuda.empty_cache()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "size": args.size,
        "latent_frames": args.latent_frames,
        "video_frames": 1 + 4 * (args.latent_frames - 1),
        "tflop_per_chunk": round(flops / 1e12, 2),
        "rows": rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
