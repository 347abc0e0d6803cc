"""Where a model's steady step goes on the GPU, kernel by kernel: the profile that chooses
the next speed lever (issue 31, item 3: "count first, then optimise").

    python bench/step_profile.py --model liveavatar --weights W --lora L --compile \
        --precision fp8 [--warm-steps 6] [--steps 2] [--json OUT]

The engine starts as every command starts it (`pipeline.startup`, the same flags as
`facecast bench`); one stream of the benchmark's test card is fed a step's audio at a time,
as `facecast bench` feeds it, for `--warm-steps` steps (LiveAvatar's key window is full
after 4 blocks, so its steady shape needs 5 or more), then `--steps` steps run under
torch's profiler. Reported, per profiled step: wall time, the GPU's busy time (kernels on
any stream, overlaps merged) and so its idle share, kernel time by kind (FP8 and bf16
matrix products, attention, convolutions, the compiled fused kernels, copies, the rest),
and the largest kernels by name. With `--ops`, also the operators that launched the most
GPU time, by name and input shapes: where eager copies and elementwise kernels come from.
Recording every operator's shapes slows the host, so the operators come from a second
profile of as many steps after the first: the kernels, wall time and idle share are read
from a profile without it. `--device cpu` with a test-shape release only checks that
it runs (the CPU's operators stand in for kernels).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench import git_commit, speech_like_audio, test_card  # noqa: E402
from pipeline.config import parse_overrides  # noqa: E402
from pipeline.startup import EngineOptions, start_engine  # noqa: E402
from pipeline.stream import ready_pieces, samples_wanted  # noqa: E402

# first match wins: a kernel's kind from its name (cuBLAS, cuDNN, CUTLASS, Triton, ATen)
KINDS = [
    ("attention", re.compile(r"fmha|flash|attn|attention|sdpa", re.I)),
    ("conv", re.compile(r"conv|implicit|wgrad|dgrad|fprop", re.I)),  # before GEMMs: implicit GEMMs
    ("gemm fp8", re.compile(r"(e4m3|e5m2|f8|fp8).*(gemm|xmma|cutlass|nvjet|matmul)|"
                            r"(gemm|xmma|cutlass|nvjet|matmul).*(e4m3|e5m2|f8|fp8)", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|matmul|cublas", re.I)),
    ("compiled (triton)", re.compile(r"^triton", re.I)),
    ("copy", re.compile(r"copy|memcpy|memset|cat|fill", re.I)),
]  # fmt: skip


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def busy_ms(spans: list[tuple[float, float]]) -> float:
    """The union of [start, end) spans, in ms: the time the GPU ran anything."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total / 1e3


def kernel_report(prof, wall_s: float, steps: int, top: int) -> dict:
    """The profiled steps' kernels: per step, by kind and by name."""
    # kernels only: the GPU-side spans of record_function annotations (inductor's, the
    # profiler's own) cover kernels already counted
    device_events = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and e.device_time > 0
        and not e.is_user_annotation
    ] or [e for e in prof.events() if e.self_cpu_time_total > 0]  # a CPU run: its operators
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    spans = []
    for e in device_events:
        us = e.device_time if e.device_time > 0 else e.self_cpu_time_total
        by_kind[kind_of(e.name)] += us / 1e3
        by_name[e.name] += us / 1e3
        count[e.name] += 1
        start = e.time_range.start
        spans.append((start, start + us))
    busy = busy_ms(spans)
    per = 1.0 / steps
    largest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "wall_ms_per_step": wall_s * 1e3 * per,
        "gpu_busy_ms_per_step": busy * per,
        "gpu_idle_share": max(0.0, 1.0 - busy / (wall_s * 1e3)),
        "kernel_ms_per_step_by_kind": {
            k: v * per for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "largest_kernels": [
            {"name": name[:160], "ms_per_step": ms * per, "calls_per_step": count[name] * per}
            for name, ms in largest
        ],
    }


def op_report(prof, steps: int, top: int, cuda: bool) -> list[dict]:
    """The operators whose own kernels took the most time, by name and input shapes, per
    step (an operator's children are counted where they are, not in it)."""
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            rows.append((us, e.key, str(e.input_shapes)[:160], e.count))
    rows.sort(key=lambda r: -r[0])
    return [
        {
            "op": key,
            "input_shapes": shapes,
            "ms_per_step": us / 1e3 / steps,
            "calls_per_step": n / steps,
        }
        for us, key, shapes, n in rows[:top]
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--weights")
    p.add_argument("--lora")
    p.add_argument("--wav2vec")
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", default="default")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--warm-steps", type=int, default=6)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--ops", action="store_true", help="also the operators, by input shapes")
    p.add_argument("--json")
    args = p.parse_args()
    overrides = parse_overrides(args.set)
    opts = EngineOptions(
        model=args.model,
        weights=args.weights,
        lora=args.lora,
        wav2vec=args.wav2vec,
        device=args.device,
        compile=args.compile,
        precision=args.precision,
        overrides=overrides,
    )
    engine, _ = start_engine(opts)
    v = engine.cfg.video
    steps = args.warm_steps + args.steps * (2 if args.ops else 1)
    # audio for every step and a margin (a step takes well under two seconds of audio)
    audio = speech_like_audio(2.0 * (steps + 2))
    stream = engine.new_stream(test_card(v.height, v.width), seed=0)
    cuda = engine.device.type == "cuda"

    def step() -> int:
        total = stream.timeline.total
        stream.push_audio(audio[total : total + samples_wanted(stream)])
        return sum(len(b.frames) for b in ready_pieces(stream))

    for _ in range(args.warm_steps):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def profiled(record_shapes: bool) -> tuple[profile, float, int]:
        with profile(activities=activities, record_shapes=record_shapes) as prof:
            t = time.perf_counter()
            frames = sum(step() for _ in range(args.steps))
            if cuda:
                torch.cuda.synchronize(engine.device)
            wall = time.perf_counter() - t
        return prof, wall, frames

    prof, wall, frames = profiled(record_shapes=False)
    ops_prof = profiled(record_shapes=True)[0] if args.ops else None
    stream.close()
    report = {
        "meta": {
            "model": args.model,
            "compile": args.compile,
            "precision": args.precision,
            "set": overrides,
            "gpu": torch.cuda.get_device_name(engine.device) if cuda else "cpu",
            "torch": torch.__version__,
            "commit": git_commit(),
            "warm_steps": args.warm_steps,
            "steps": args.steps,
            "frames": frames,
        },
        **kernel_report(prof, wall, args.steps, args.top),
    }
    if ops_prof is not None:
        report["largest_ops"] = op_report(ops_prof, args.steps, args.top, cuda)
    kinds = ", ".join(f"{k} {ms:.1f}" for k, ms in report["kernel_ms_per_step_by_kind"].items())
    print(
        f"{args.model}: a step {report['wall_ms_per_step']:.1f} ms, GPU busy "
        f"{report['gpu_busy_ms_per_step']:.1f} ms (idle {report['gpu_idle_share']:.0%}); "
        f"kernel ms a step by kind: {kinds}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
