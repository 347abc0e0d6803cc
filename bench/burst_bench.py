"""Does a burst of GPU work run faster after the GPU has idled? A served call's steps start
when its audio has come, a chunk apart, and FlashHead Pro's ran 7 % faster than the same steps
back to back, all of it in the DiT's matrix products (bench/RESULTS.md, 2026-12-05), while
nvidia-smi's half-second samples showed no lower clock. This times the DiT's kind of work
alone, no engine, no host in the way:

    python bench/burst_bench.py [--burst-s 0.25] [--bursts 20] [--gaps 0,0.1,0.3,0.6] [--json OUT]

A burst is a run of matrix products of a FlashHead Pro block's shape (9,216 tokens of width
1,536 into its 6,144-wide MLP), in bf16 and in FP8 with fast accumulation (`torch._scaled_mm`,
as `--precision fp8-fast` runs them), as many as take `--burst-s` on this GPU. Each burst is
timed with CUDA events; between bursts the host sleeps each gap in turn (0: back to back).
Printed and in the JSON: each gap's median burst and its speed against back to back. If
bursts after a gap run faster, the GPU's power management (not the engine, not the host)
is what makes a served step faster than a benchmarked one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench import git_commit  # noqa: E402

TOKENS, WIDTH, HIDDEN = 9216, 1536, 6144  # a FlashHead Pro block's MLP, one chunk
PROBE = 40  # products timed once to size a burst


def products(kind: str, device: torch.device):
    """One matrix product of the block's shape, as a callable, in `kind` (bf16 | fp8)."""
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(TOKENS, WIDTH, device=device, generator=g, dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, WIDTH, device=device, generator=g, dtype=torch.bfloat16) / 40
    if kind == "bf16":
        return lambda: x @ w.t()
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    return lambda: torch._scaled_mm(
        x8, w8.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True
    )


def burst(fn, count: int) -> float:
    """`count` products back to back on the GPU; seconds, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burst-s", type=float, default=0.25, help="one burst's length (s)")
    ap.add_argument("--bursts", type=int, default=20, help="bursts timed per gap")
    ap.add_argument("--gaps", default="0,0.1,0.3,0.6", help="idle seconds between bursts")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("burst_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    gaps = [float(g) for g in args.gaps.split(",")]
    results = {}
    for kind in ("bf16", "fp8"):
        fn = products(kind, device)
        for _ in range(3):  # kernels chosen, clocks up
            burst(fn, PROBE)
        count = max(1, round(args.burst_s / (burst(fn, PROBE) / PROBE)))
        flops = 2 * TOKENS * WIDTH * HIDDEN * count
        rows = {}
        for gap in gaps:
            burst(fn, count)  # the gap's first burst follows the last gap's pattern: dropped
            times = []
            for _ in range(args.bursts):
                time.sleep(gap)
                times.append(burst(fn, count))
            p50 = statistics.median(times)
            rows[str(gap)] = {
                "burst_p50_s": p50,
                "burst_min_s": min(times),
                "burst_max_s": max(times),
                "tflops": flops / p50 / 1e12,
            }
        base = rows[str(gaps[0])]["burst_p50_s"]
        for gap in gaps:
            row = rows[str(gap)]
            row["faster_than_first_gap"] = base / row["burst_p50_s"]
            print(
                f"{kind} burst of {count} products, after {gap:.2f} s idle: "
                f"{row['burst_p50_s'] * 1000:.1f} ms p50 ({row['tflops']:.0f} TFLOP/s, "
                f"{row['faster_than_first_gap']:.3f}x the {gaps[0]:g}-s gap's)"
            )
        results[kind] = {"products": count, "by_gap_s": rows}
    out = {
        "command": "python bench/burst_bench.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d"),
        "shape": {"tokens": TOKENS, "width": WIDTH, "hidden": HIDDEN},
        "results": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
