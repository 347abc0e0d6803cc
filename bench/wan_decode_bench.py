"""GPU benchmark of the Wan 2.1 VAE decode of one FlashHead Pro chunk (9 latent frames → 33 frames).

The decode was 62 % of a Pro chunk on the H200 (0.399 s of 0.639 s, compiled, ~190 TFLOP/s
on 74 TFLOP). This times, on random weights of the published shapes, one process, one GPU:

- `reference`: diffusers' forward with the release's caches (what ran before
  `pipeline/models/wan/vae_decode.py`), eager and compiled as `FlashHeadEngine.compile` did;
- `causal`: `CausalDecoder` (channels-last, the look-back as state), eager and compiled;
- `causal` compiled with its options: sub-pixel upsampling, 2-D convolutions of stacked
  frames for the narrow levels (cuDNN's autotuner made no difference: 449.6 vs 448.8 ms);
- `causal` split as a stream that sends its first new frames early: passes of 1, 2 and 6
  latent frames (the first new frames of a Pro chunk are latent frame 2's), with the time
  until each pass's frames exist;

and reports ms per chunk (median of CUDA-event timings), TFLOP/s over FLOPs counted by
torch's FlopCounterMode, each variant's distance from an fp32 decode (max difference, PSNR
on [-1, 1] pixels) beside the bf16 reference's own, and the profiler's kernel time by kind
for the reference and the fastest variant.

    python bench/wan_decode_bench.py --json bench/results/flashhead/wan_decode_h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.models.wan.vae import (  # noqa: E402
    WanVAE,
    WanVAEConfig,
    checkpoint_layout,
    random_checkpoint,
)
from pipeline.models.wan.vae_decode import CausalDecoder  # noqa: E402


def build(device: str, dtype: torch.dtype, config: WanVAEConfig) -> WanVAE:
    vae = WanVAE(config)
    layout = checkpoint_layout(config)
    vae.load_state_dict({layout[k]: v for k, v in random_checkpoint(config).items()})
    return vae.to(device=device, dtype=dtype).eval().requires_grad_(False)


class Mark:
    """A point in the GPU's stream (a CUDA event), or the host clock on a CPU (dry runs)."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
        else:
            self.t = time.perf_counter()

    def ms_since(self, start: Mark) -> float:
        if self.cuda:
            return start.event.elapsed_time(self.event)
        return (self.t - start.t) * 1000


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode(vae: WanVAE, lat: torch.Tensor, reference: bool, split: list[int] | None = None):
    """The chunk's pixels; with `split`, passes of those many latent frames, and the CUDA
    events recorded after each."""
    stream = vae.stream(reference=reference)
    if split is None:
        return stream.decode(lat), []
    parts, events, t = [], [], 0
    for n in split:
        parts.append(stream.decode(lat[:, :, t : t + n]))
        events.append(Mark())
        t += n
    return torch.cat(parts, dim=2), events


def timed(vae, lat, reference, split=None, repeats=7) -> tuple[float, list[float]]:
    """Median ms of a chunk's decode, and the median ms until each pass's frames exist."""
    for _ in range(2):  # compile, cuDNN's autotuner
        decode(vae, lat, reference, split)
    totals, marks = [], []
    for _ in range(repeats):
        start = Mark()
        _, events = decode(vae, lat, reference, split)
        end = Mark()
        sync()
        totals.append(end.ms_since(start))
        marks.append([e.ms_since(start) for e in events])
    per_pass = (
        [statistics.median(m[i] for m in marks) for i in range(len(marks[0]))] if split else []
    )
    return statistics.median(totals), per_pass


def kernel_table(vae, lat, reference: bool, top: int = 14) -> list[dict]:
    """Kernel time of one decode, by kernel name, largest first."""
    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        decode(vae, lat, reference)
        sync()
    by_name: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e in prof.key_averages():
        us = e.device_time_total if cuda else e.self_cpu_time_total
        if us and e.key and (not cuda or not e.key.startswith("aten::")) and "Memcpy" not in e.key:
            by_name[e.key[:90]] += us / 1000
            counts[e.key[:90]] += e.count
    rows = sorted(by_name.items(), key=lambda kv: -kv[1])
    return [{"kernel": k, "ms": round(v, 2), "calls": counts[k]} for k, v in rows[:top]]


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.float() - b.float()).pow(2).mean().item()
    return float("inf") if mse == 0 else 10 * math.log10(4.0 / mse)  # range [-1, 1]: peak 2


def main() -> None:  # noqa: C901 - a flat list of variants, each timed and checked
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=512, help="square frame side in pixels")
    p.add_argument("--latent-frames", type=int, default=9)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path)
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script (tiny sizes)")
    p.add_argument("--base-dim", type=int, default=96, help="the VAE's width (96 as released)")
    p.add_argument(
        "--reference-compiled", action="store_true", help="also diffusers' decoder compiled"
    )
    p.add_argument(
        "--all-layouts",
        action="store_true",
        help="also plain upsampling and the 2-D convolutions of stacked frames",
    )
    p.add_argument("--autotune", action="store_true",
                   help="also the whole pass under max-autotune (inductor's own convolution templates; minutes of tuning)")  # fmt: skip
    args = p.parse_args()
    dev, dtype = args.device, torch.bfloat16
    config = WanVAEConfig(base_dim=args.base_dim)
    h = args.size // 8
    gen = torch.Generator(device=dev).manual_seed(0)
    lat = torch.randn((1, 16, args.latent_frames, h, h), generator=gen, device=dev)

    result: dict = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
                    "size": args.size, "latent_frames": args.latent_frames,
                    "video_frames": 1 + 4 * (args.latent_frames - 1), "rows": []}  # fmt: skip
    with torch.inference_mode():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        exact = (
            build(dev, torch.float32, config).stream(reference=True).decode(lat)
        )  # the yardstick
        torch.cuda.empty_cache()
        ref_vae, fast_vae = build(dev, dtype, config), build(dev, dtype, config)
        lat_b = lat.to(dtype)
        with FlopCounterMode(display=False) as counter:
            decode(ref_vae, lat_b, True)
        flops = counter.get_total_flops()
        result["tflop_per_chunk"] = round(flops / 1e12, 2)
        result["peak_gib_fp32_reference"] = (
            round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev == "cuda" else None
        )
        print(f"{flops / 1e12:.1f} TFLOP a chunk", flush=True)
        ref_out = decode(ref_vae, lat_b, True)[0]
        result["reference_bf16_vs_fp32"] = {"psnr_db": round(psnr(ref_out, exact), 2),
                                            "max_diff": round((ref_out.float() - exact).abs().max().item(), 4)}  # fmt: skip

        def run(label: str, vae: WanVAE, reference: bool, split=None) -> None:
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
            try:
                ms, marks = timed(vae, lat_b, reference, split, args.repeats)
                out = decode(vae, lat_b, reference, split)[0]
            except Exception as e:  # one variant failing must not hide the others
                print(f"{label}: FAILED {type(e).__name__}: {e}", flush=True)
                result["rows"].append({"variant": label, "error": f"{type(e).__name__}: {e}"})
                return
            row = {"variant": label, "ms": round(ms, 1), "tflops": round(flops / ms / 1e9, 1),
                   "psnr_vs_fp32_db": round(psnr(out, exact), 2),
                   "psnr_vs_reference_bf16_db": round(psnr(out, ref_out), 2),
                   "max_diff_vs_reference_bf16": round((out.float() - ref_out.float()).abs().max().item(), 4),
                   "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev == "cuda" else None}  # fmt: skip
            if split:
                row["split"], row["pass_done_ms"] = split, [round(m, 1) for m in marks]
            result["rows"].append(row)
            print(row, flush=True)

        run("reference eager", ref_vae, True)
        result["kernels_reference_eager"] = kernel_table(ref_vae, lat_b, True)
        if args.reference_compiled:  # 311 ms on the H200 (2026-12-02)
            ref_vae.net.decoder.forward = torch.compile(ref_vae.net.decoder.forward)  # type: ignore[method-assign]
            run("reference compiled", ref_vae, True)
        run("causal eager", fast_vae, False)
        # 2026-12-02's product: the norms compiled one function at a time
        fast_vae._causal_decoder = CausalDecoder(fast_vae.net.decoder, tap_convs_below=0)
        fast_vae.causal_decoder.compile()
        run("causal compiled per function, sub-pixel upsampling", fast_vae, False)
        # one graph a pass: the glue between cuDNN's convolutions fused with the norms
        variants: dict[str, dict] = {
            "sub-pixel upsampling": dict(tap_convs_below=0),
            "sub-pixel, 96-ch taps as 2-D": dict(tap_convs_below=128),
            "sub-pixel, 96/192-ch taps as 2-D": dict(tap_convs_below=256),
        }
        if args.all_layouts:  # slower on the H200 (2026-12-02: 272, 397 and 617 ms against 260)
            variants["plain upsampling"] = dict(subpixel_upsample=False, tap_convs_below=0)
            variants["sub-pixel, 2-D below 128 ch"] = dict(stack_time_below=128, tap_convs_below=0)
            variants["sub-pixel, 2-D below 256 ch"] = dict(stack_time_below=256, tap_convs_below=0)
        modes = (
            {"": None, ", max-autotune": "max-autotune-no-cudagraphs"}
            if args.autotune
            else {"": None}
        )
        best, best_ms = ("", None), float("inf")
        for name, options in variants.items():
            for suffix, mode in modes.items():
                fast_vae._causal_decoder = CausalDecoder(fast_vae.net.decoder, **options)
                fast_vae.causal_decoder.compile(mode=mode, whole_pass=True)
                run(f"causal, one graph a pass, {name}{suffix}", fast_vae, False)
                ms = result["rows"][-1].get("ms", float("inf"))
                if ms < best_ms:
                    best, best_ms = (name, mode), ms
        fast_vae._causal_decoder = CausalDecoder(fast_vae.net.decoder, **variants[best[0]])
        fast_vae.causal_decoder.compile(mode=best[1], whole_pass=True)
        best_name = f"one graph a pass, {best[0]}{' (max-autotune)' if best[1] else ''}"
        if dev == "cuda":  # cuDNN's autotuner on the best graph
            torch.backends.cudnn.benchmark = True
            run(f"causal, {best_name} + cudnn.benchmark", fast_vae, False)
            torch.backends.cudnn.benchmark = False
        n = args.latent_frames
        run(f"causal, {best_name}, passes 1+2+{n - 3}", fast_vae, False, [1, 2, n - 3])
        run(f"causal, {best_name}, passes 1+2+2+2+2", fast_vae, False, [1, 2, 2, 2, 2])
        result["kernels_causal_compiled"] = kernel_table(fast_vae, lat_b, False)
        for row in result["kernels_causal_compiled"][:10]:
            print(row, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| variant | ms | TFLOP/s | PSNR vs fp32 | vs ref bf16 (max diff) |")
    for r in result["rows"]:
        if "ms" in r:
            print(f"| {r['variant']} | {r['ms']} | {r['tflops']} | {r['psnr_vs_fp32_db']} | "
                  f"{r['psnr_vs_reference_bf16_db']} ({r['max_diff_vs_reference_bf16']}) |")  # fmt: skip
    print("reference bf16 vs fp32:", result["reference_bf16_vs_fp32"])


if __name__ == "__main__":
    main()
