"""The Wan decoder's widest convolutions, one at a time: where cuDNN's kernel choice goes.

At a FlashHead Pro chunk's top level (96 channels, 512x512, 8 video frames a pass after
two of look-back) a causal 3x3x3 convolution runs on cuDNN's sm80 implicit-GEMM 256x32
kernel: 101.5 ms in 14 calls of a 215 ms decode (H200, 2026-12-03). This times the same
sums written other ways, each checked against the first:

- `conv3d`: as the decoder runs it (channels-last, bf16);
- `conv3d fp16`: the same in float16 (cuDNN's heuristics differ by dtype);
- `conv3d, 128 channels`: input and output channels padded to 128 (more FLOPs, other tiles);
- `taps as outputs`: one 2-D convolution of every input frame into its three temporal
  taps' contributions (288 output channels), then output frame t = tap 0 of input t +
  tap 1 of t + 1 + tap 2 of t + 2;
- `three 2-D convolutions`: one per temporal tap over shifted frames, summed.

    python bench/wan_conv_bench.py [--channels 96] [--size 512] [--frames 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench import gpu_median_ms  # noqa: E402

CL3D = torch.channels_last_3d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--channels", type=int, default=96)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--frames", type=int, default=8, help="output frames (input: 2 more)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    dev, C, T, S = "cuda", a.channels, a.frames, a.size
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, C, T + 2, S, S, generator=g, device=dev, dtype=torch.bfloat16)
    x = x.contiguous(memory_format=CL3D)
    w = (torch.randn(C, C, 3, 3, 3, generator=g, device=dev) / (27 * C) ** 0.5).to(x.dtype)
    b = torch.randn(C, generator=g, device=dev, dtype=x.dtype) * 0.1
    w_cl = w.contiguous(memory_format=CL3D)
    flops = 2 * C * C * 27 * S * S * T

    frames = x.permute(0, 2, 1, 3, 4).reshape(T + 2, C, S, S)  # channels-last 2-D, a view
    w_taps = w.permute(2, 0, 1, 3, 4).reshape(3 * C, C, 3, 3)  # [tap, out] outputs
    w_taps = w_taps.contiguous(memory_format=torch.channels_last)
    w_tap = [w[:, :, k].contiguous(memory_format=torch.channels_last) for k in range(3)]
    pad = 128 - C
    x128 = F.pad(x, (0, 0, 0, 0, 0, 0, 0, pad)).contiguous(memory_format=CL3D) if pad > 0 else x
    w128 = F.pad(w, (0, 0, 0, 0, 0, 0, 0, pad, 0, pad)).contiguous(memory_format=CL3D)
    b128 = F.pad(b, (0, pad))
    x16, w16, b16 = x.half(), w_cl.half(), b.half()

    def conv3d():
        return F.conv3d(x, w_cl, b, padding=(0, 1, 1))

    def conv3d_fp16():
        return F.conv3d(x16, w16, b16, padding=(0, 1, 1))

    def conv3d_128():
        return F.conv3d(x128, w128, b128, padding=(0, 1, 1))[:, :C]

    def taps_as_outputs():
        z = F.conv2d(frames, w_taps, None, padding=1)  # (T+2, 3C, S, S) channels-last
        z = z.view(T + 2, 3, C, S, S)
        y = z[0:T, 0] + z[1 : T + 1, 1] + z[2 : T + 2, 2] + b[:, None, None]
        return y.unsqueeze(0).permute(0, 2, 1, 3, 4)

    def three_2d():
        y = F.conv2d(frames[0:T], w_tap[0], b, padding=1)
        y += F.conv2d(frames[1 : T + 1], w_tap[1], None, padding=1)
        y += F.conv2d(frames[2 : T + 2], w_tap[2], None, padding=1)
        return y.unsqueeze(0).permute(0, 2, 1, 3, 4)

    variants = {
        "conv3d": conv3d,
        "conv3d fp16": conv3d_fp16,
        "conv3d, 128 channels": conv3d_128,
        "taps as outputs": taps_as_outputs,
        "three 2-D convolutions": three_2d,
    }
    rows = []
    with torch.inference_mode():
        want = conv3d().float()
        for benchmark in (False, True):
            torch.backends.cudnn.benchmark = benchmark
            for name, fn in variants.items():
                try:
                    t, out = gpu_median_ms(fn, a.repeats)
                except Exception as err:  # one way failing must not hide the others
                    rows.append({"variant": name, "error": f"{type(err).__name__}: {err}"[:200]})
                    print(rows[-1], flush=True)
                    continue
                diff = (out.float() - want).abs().max().item()
                label = name + (" + cudnn.benchmark" if benchmark else "")
                row = {"variant": label, "ms": round(t, 3), "tflops": round(flops / t / 1e9, 1),
                       "max_diff": round(diff, 4)}  # fmt: skip
                rows.append(row)
                print(row, flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "shape": {"channels": C, "size": S, "frames": T}, "rows": rows}  # fmt: skip
        a.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
