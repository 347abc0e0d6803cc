"""GPU benchmark of the SR stage's frame-window attention: SDPA, FlexAttention, facecast kernel.

At rt720's SR shapes (F = 80x48 = 3840 tokens per frame, T = 8 latent frames + 1 reference,
W = 1, dim 1536 as 12 heads of 128, and 24 heads of 64), one process:

1. checks correctness of every masked variant against an fp32 reference (per query frame,
   SDPA over the gathered visible keys, which is the masked attention exactly) and against
   bf16 SDPA with the dense bool mask; relative error (Frobenius) and NaN count;
2. times (triton.testing.do_bench, median, L2 flushed between reps) dense SDPA at the same
   length (each backend), FlexAttention compiled with the aligned BlockMask, and the facecast
   kernel over a sweep of tile / warp / stage configs, bounded and online softmax;
3. reports the share of heads and row blocks that qualify for the bounded softmax, on the
   random inputs and on the activations of the pipeline's own SR DiT (rt720 preset).

Useful FLOPs count 4*D per visible (query, key) pair; dense SDPA counts all L*L pairs.
Writes JSON (--out) and prints a markdown table. Run from the repo root:

    python bench/attention_bench.py --out bench/results/attention_h200.json --commit <sha>
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F_nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.kernels import (  # noqa: E402
    FrameWindowSpec,
    KernelConfig,
    bounded_softmax_share,
    flex_frame_attention,
    frame_window_attention,
    frame_window_block_mask,
    frame_window_flops,
    frame_window_mask,
)
from pipeline.kernels.frame_attention import _DEFAULT_CONFIGS, key_frame_stats  # noqa: E402
from pipeline.kernels.frame_mask import visible_frame_span  # noqa: E402

# (name, config): the sweep per head_dim, most promising first. Each config runs bounded and
# online (one compiled kernel). Warp specialization is a newer Triton feature on Hopper that can
# fail to compile or hang: those configs run last, after everything else is saved.
SWEEP = {
    128: [
        ("default", None),
        ("m128n64w8s4-pipe", KernelConfig(128, 64, 8, 4, pipeline_qk=True)),
        ("m128n64w8s3", KernelConfig(128, 64, 8, 3)),
        ("m128n64w8s2", KernelConfig(128, 64, 8, 2)),
        ("m128n128w8s1", KernelConfig(128, 128, 8, 1)),
        ("m128n64w8s3-ptr-pipe", KernelConfig(128, 64, 8, 3, use_tma=False, pipeline_qk=True)),
    ],
    64: [
        ("default", None),
        ("m128n64w8s4-pipe", KernelConfig(128, 64, 8, 4, pipeline_qk=True)),
        ("m128n64w8s3", KernelConfig(128, 64, 8, 3)),
        ("m128n64w8s4", KernelConfig(128, 64, 8, 4)),
        ("m128n128w8s3-pipe", KernelConfig(128, 128, 8, 3, pipeline_qk=True)),
    ],
}
# First run (commit 605fd3a) also swept: m128n64w8s2-pipe, m128n128w8s3 (D=64), m64n64w4s3,
# pointer loads, and warp specialization (no gain on Hopper with Triton 3.6); see RESULTS.md.
RISKY = {
    128: [
        (
            "m128n64w8s3-pipe-ws",
            KernelConfig(128, 64, 8, 3, pipeline_qk=True, warp_specialize=True),
        ),
    ],
}


def timed_ms(fn, reps_ms: int) -> float:
    """Median milliseconds of fn(); device events on CUDA, a host clock on the CPU (dry runs)."""
    if torch.cuda.is_available():
        import triton.testing

        warmup_ms = 25  # not the clock: triton's warm-up budget
        return float(
            triton.testing.do_bench(fn, warmup=warmup_ms, rep=reps_ms, return_mode="median")
        )
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[1]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> dict:
    nan = int(torch.isnan(out).sum())
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    return {"rel_err": err, "nan": nan}


def masked_reference_fp32(q, k, v, spec: FrameWindowSpec) -> torch.Tensor:
    """Exact masked attention in fp32: per query frame, dense SDPA over its visible keys."""
    B, H, L, D = q.shape
    F, R = spec.tokens_per_frame, spec.ref_frames
    num_video = spec.num_video_frames(L)
    out = torch.empty(B, H, L, D, device=q.device, dtype=torch.float32)
    for frame in range(R + num_video):
        lo, hi = visible_frame_span(frame, spec, num_video)
        keys = torch.cat([torch.arange(0, R * F), torch.arange(lo * F, hi * F)]).to(q.device)
        rows = slice(frame * F, (frame + 1) * F)
        out[:, :, rows] = F_nn.scaled_dot_product_attention(
            q[:, :, rows].float(), k[:, :, keys].float(), v[:, :, keys].float()
        )
    return out


def try_run(label: str, fn, log: list):
    try:
        return fn()
    except Exception as exc:  # one failing variant must not sink the whole lease
        msg = f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        print("FAILED", msg, flush=True)
        log.append({"variant": label, "error": msg, "trace": traceback.format_exc()[-2000:]})
        return None


def tflops(flops: int, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


class Case:
    """Inputs and reference for one head_dim at the benchmark shape."""

    def __init__(self, args, D: int) -> None:
        dev = args.device
        self.D, self.H = D, args.dim // D
        B, F, T, W, R = args.batch, args.tokens_per_frame, args.frames, args.window, args.ref
        self.spec = FrameWindowSpec(F, W, R)
        self.L = L = (R + T) * F
        self.kw = {"tokens_per_frame": F, "window": W, "ref_frames": R}
        self.useful = frame_window_flops(B, self.H, L, D, self.spec)
        self.dense = frame_window_flops(B, self.H, L, D, None)
        gen = torch.Generator(device=dev).manual_seed(1000 + D)
        self.q, self.k, self.v = (
            torch.randn(B, self.H, L, D, device=dev, generator=gen, dtype=torch.bfloat16)
            for _ in "qkv"
        )
        self.ref = masked_reference_fp32(self.q, self.k, self.v, self.spec)
        self.rows: list = []

    def add(self, name: str, ms: float, flops: int, **extra) -> None:
        self.rows.append({"variant": name, "ms": ms, "tflops": tflops(flops, ms), **extra})
        print(f"  {name:44s} {ms:8.3f} ms {tflops(flops, ms):7.1f} TFLOP/s", flush=True)


def baselines(args, case: Case, res: dict, log: list) -> None:  # noqa: C901 - one flat list of variants, each a few lines, read top to bottom
    """Correctness of every variant's default, then dense SDPA, masked SDPA and Flex timings."""
    q, k, v, ref, kw, L, dev = case.q, case.k, case.v, case.ref, case.kw, case.L, args.device
    t0 = time.time()
    checks = {}
    mask = try_run("dense mask", lambda: frame_window_mask(L, **kw, device=dev), log)
    sdpa_masked = None
    if mask is not None:
        sdpa_masked = try_run(
            "sdpa masked", lambda: F_nn.scaled_dot_product_attention(q, k, v, attn_mask=mask), log
        )
        if sdpa_masked is not None:
            checks["sdpa_masked_vs_fp32"] = rel_err(sdpa_masked, ref)
    for softmax in ("bounded", "online"):
        out = try_run(
            f"facecast {softmax}",
            lambda s=softmax: frame_window_attention(q, k, v, **kw, softmax=s),
            log,
        )
        if out is not None:
            checks[f"facecast_{softmax}_vs_fp32"] = rel_err(out, ref)
            if sdpa_masked is not None:
                checks[f"facecast_{softmax}_vs_sdpa_masked"] = rel_err(out, sdpa_masked)
    block_mask = try_run(
        "block mask", lambda: frame_window_block_mask(L, **kw, device=dev, block_size=128), log
    )
    if block_mask is not None:
        flex_out = try_run("flex", lambda: flex_frame_attention(q, k, v, block_mask), log)
        if flex_out is not None:
            checks["flex_vs_fp32"] = rel_err(flex_out, ref)
    res["correctness"] = checks
    res["correctness_s"] = time.time() - t0
    print(f"D={case.D} correctness ({res['correctness_s']:.0f} s):", json.dumps(checks), flush=True)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def dense_sdpa():
        return F_nn.scaled_dot_product_attention(q, k, v)

    ms = try_run("sdpa dense", lambda: timed_ms(dense_sdpa, args.rep), log)
    if ms:
        case.add("sdpa dense (default dispatch)", ms, case.dense, kind="dense")
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):

        def run_backend(b=backend):
            with sdpa_kernel(getattr(SDPBackend, b)):
                return timed_ms(dense_sdpa, args.rep)

        ms = try_run(f"sdpa dense {backend}", run_backend, log)
        if ms:
            case.add(f"sdpa dense {backend.lower()}", ms, case.dense, kind="dense")
    if sdpa_masked is not None:

        def masked_sdpa():
            return F_nn.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        ms = try_run("sdpa masked time", lambda: timed_ms(masked_sdpa, args.rep), log)
        if ms:
            case.add("sdpa + dense bool mask", ms, case.useful, kind="masked")
    if block_mask is not None:

        def flex():
            return flex_frame_attention(q, k, v, block_mask)

        ms = try_run("flex time", lambda: timed_ms(flex, args.rep), log)
        if ms:
            case.add("flex (compiled, aligned BlockMask)", ms, case.useful, kind="flex")

    nf = args.ref + args.frames
    k2 = k.view(-1, case.D)

    def stats():
        return key_frame_stats(k2, args.batch * case.H, nf, args.tokens_per_frame)

    res["stats_prepass_ms"] = try_run("stats", lambda: timed_ms(stats, args.rep), log)


def sweep(args, case: Case, configs, log: list, deadline: float) -> None:
    """Time each config, bounded and online, after checking its output against the reference."""
    for name, cfg in configs:
        if time.time() > deadline:
            log.append({"variant": name, "error": "skipped: out of time"})
            continue
        for softmax in ("bounded", "online"):

            def call(c=cfg, s=softmax):
                return frame_window_attention(
                    case.q, case.k, case.v, **case.kw, softmax=s, config=c
                )

            label = f"facecast {name} {softmax}"
            # Every config is checked before it is timed: a fast wrong kernel must not count.
            check = try_run(label, lambda c=call: rel_err(c(), case.ref), log)
            if check is None or check["nan"] or not check["rel_err"] <= 1e-2:
                log.append({"variant": label, "error": f"failed the check: {check}"})
                continue
            ms = try_run(label, lambda c=call: timed_ms(c, args.rep), log)
            if ms:
                resolved = cfg or _DEFAULT_CONFIGS[case.D]
                case.add(label, ms, case.useful, kind="facecast", config=name, softmax=softmax,
                         cfg=dataclasses.asdict(resolved), check=check)  # fmt: skip


def summarize(res: dict) -> dict:
    rows = res["timings"]

    def best(pred):
        cand = [r for r in rows if pred(r)]
        return max(cand, key=lambda r: r["tflops"]) if cand else None

    default_dense = best(lambda r: r["variant"] == "sdpa dense (default dispatch)")
    best_dense = best(lambda r: r.get("kind") == "dense")
    flex = best(lambda r: r.get("kind") == "flex")
    bounded = best(lambda r: r.get("softmax") == "bounded")
    online = best(lambda r: r.get("softmax") == "online")
    default_b = best(lambda r: r.get("config") == "default" and r["softmax"] == "bounded")
    default_o = best(lambda r: r.get("config") == "default" and r["softmax"] == "online")
    s = {"best_bounded": bounded, "best_online": online, "default_bounded": default_b,
         "default_online": default_o}  # fmt: skip
    if default_b and default_dense:
        s["default_bounded_vs_sdpa_default"] = default_b["tflops"] / default_dense["tflops"]
    if default_b and best_dense:
        s["default_bounded_vs_best_dense"] = default_b["tflops"] / best_dense["tflops"]
    if default_b and flex:
        s["default_bounded_vs_flex"] = default_b["tflops"] / flex["tflops"]
    if bounded and default_dense:
        s["bounded_vs_sdpa_default"] = bounded["tflops"] / default_dense["tflops"]
    if bounded and best_dense:
        s["bounded_vs_best_dense"] = bounded["tflops"] / best_dense["tflops"]
    if bounded and flex:
        s["bounded_vs_flex"] = bounded["tflops"] / flex["tflops"]
    # Bounded vs online at the same config, and each one's best.
    pairs = {}
    for r in rows:
        if r.get("kind") == "facecast":
            pairs.setdefault(r["config"], {})[r["softmax"]] = r["ms"]
    s["online_over_bounded_ms_per_config"] = {
        c: p["online"] / p["bounded"] for c, p in pairs.items() if len(p) == 2
    }
    if bounded and online:
        s["best_online_over_best_bounded_ms"] = online["ms"] / bounded["ms"]
    stats_ms = res.get("stats_prepass_ms")
    if stats_ms and bounded and bounded["config"] in pairs and len(pairs[bounded["config"]]) == 2:
        p = pairs[bounded["config"]]
        # Only the bounded call runs the stats pre-pass; take it out for the kernels alone.
        s["kernel_only_online_over_bounded"] = p["online"] / (p["bounded"] - stats_ms)
    return s


def head_shares_random(args, D: int) -> dict:
    dev = args.device
    H = args.dim // D
    L = (args.ref + args.frames) * args.tokens_per_frame
    gen = torch.Generator(device=dev).manual_seed(2000 + D)
    q, k = (
        torch.randn(args.batch, H, L, D, device=dev, generator=gen, dtype=torch.bfloat16)
        for _ in "qk"
    )
    share = bounded_softmax_share(
        q, k, tokens_per_frame=args.tokens_per_frame, window=args.window, ref_frames=args.ref
    )
    return {
        "heads": share.heads,
        "row_blocks": share.row_blocks,
        "max_gap_log2": share.max_gap_BH.max().item(),
    }


def head_shares_pipeline(args) -> dict:
    """Shares on the SR DiT's own q, k for a preset (seeded init: rt720 has no trained weights)."""
    from pipeline.config import load_config
    from pipeline.diffusion.config import latent_grid
    from pipeline.diffusion.sr_dit import SRDiT
    from pipeline.models.attention import Attention
    from pipeline.module import build_seeded

    cfg = load_config(args.pipeline_config)
    grid = latent_grid(cfg)
    C = cfg.diffusion.vae.latent_channels
    dev = args.device
    backend = "facecast" if dev == "cuda" else "sdpa"  # the interpreter is too slow for a model
    model = build_seeded(
        lambda: SRDiT(cfg.diffusion.sr, C, cfg.diffusion.a2v.downscale, backend),
        cfg.runtime.init_seed + 4,
        dev,
    )
    model = model.to(torch.bfloat16).eval()
    per_layer = []

    def hook(module, inputs):
        q, k, _, window = inputs
        share = bounded_softmax_share(
            q,
            k,
            tokens_per_frame=window.tokens_per_frame,
            window=window.window,
            ref_frames=window.ref_frames,
        )
        per_layer.append({"heads": share.heads, "row_blocks": share.row_blocks,
                          "max_gap_log2": share.max_gap_BH.max().item()})  # fmt: skip

    handles = [
        m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, Attention)
    ]
    full_h, full_w, h, w = grid.full_h, grid.full_w, grid.low_h, grid.low_w
    gen = torch.Generator(device=dev).manual_seed(7)
    low = torch.randn(1, C, args.frames, h, w, device=dev, generator=gen, dtype=torch.bfloat16)
    noise = torch.randn(
        1, C, args.frames, full_h, full_w, device=dev, generator=gen, dtype=torch.bfloat16
    )
    ref = torch.randn(1, C, 1, full_h, full_w, device=dev, generator=gen, dtype=torch.bfloat16)
    with torch.no_grad():
        model(low, noise, ref)
    for hd in handles:
        hd.remove()
    n = len(per_layer)
    return {
        "layers": n,
        "heads": sum(p["heads"] for p in per_layer) / n,
        "row_blocks": sum(p["row_blocks"] for p in per_layer) / n,
        "max_gap_log2": max(p["max_gap_log2"] for p in per_layer),
        "per_layer": per_layer,
    }


def markdown(report: dict) -> str:
    lines = [
        "| head_dim x heads | variant | ms | TFLOP/s (useful) |",
        "| --- | --- | ---: | ---: |",
    ]
    for res in report["results"]:
        for r in res["timings"]:
            lines.append(
                f"| {res['head_dim']} x {res['heads']} | {r['variant']} | {r['ms']:.3f} | {r['tflops']:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens-per-frame", type=int, default=3840)
    ap.add_argument("--frames", type=int, default=8, help="video latent frames T")
    ap.add_argument("--window", type=int, default=1)
    ap.add_argument("--ref", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dim", type=int, default=1536, help="model dim; heads = dim / head_dim")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--max-configs", type=int, default=99)
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    ap.add_argument("--no-pipeline", action="store_true")
    ap.add_argument("--risky", action="store_true", help="also sweep warp-specialized configs")
    ap.add_argument("--budget-s", type=float, default=240, help="no new config after this")
    ap.add_argument("--pipeline-config", default="rt720", help="preset whose SR DiT is probed")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default=" ".join(sys.argv))
    ap.add_argument("--out", type=Path, default=Path("bench/results/attention_h200.json"))
    args = ap.parse_args()
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    t_start = time.time()
    log: list = []
    import triton

    report = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": args.commit,
        "command": args.command,
        "shape": {
            "tokens_per_frame": args.tokens_per_frame,
            "frames": args.frames,
            "window": args.window,
            "ref_frames": args.ref,
            "batch": args.batch,
            "dim": args.dim,
        },  # fmt: skip
        "results": [],
        "errors": log,
    }
    deadline = t_start + args.budget_s

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))

    def finish(res: dict, case: Case) -> None:
        res["timings"] = case.rows
        res["summary"] = summarize(res)
        print(f"D={case.D} summary:", json.dumps(res["summary"], default=str)[:1500], flush=True)
        save()

    by_dim = {}
    for D in args.head_dims:
        case = Case(args, D)
        res = {"head_dim": D, "heads": case.H, "seq_len": case.L, "useful_flops": case.useful,
               "dense_flops": case.dense, "density": case.useful / case.dense}  # fmt: skip
        report["results"].append(res)
        by_dim[D] = res
        baselines(args, case, res, log)
        sweep(args, case, SWEEP[D][: args.max_configs], log, deadline)
        res["share_random"] = try_run(
            f"share random D={D}", lambda d=D: head_shares_random(args, d), log
        )
        finish(res, case)
        del case
        if D == args.head_dims[0] and not args.no_pipeline:
            report["share_pipeline_sr"] = try_run(
                "share pipeline", lambda: head_shares_pipeline(args), log
            )
            save()
    for D in args.head_dims if args.risky else []:
        if D in RISKY and time.time() < deadline:
            case = Case(args, D)
            case.rows = by_dim[D]["timings"]
            sweep(args, case, RISKY[D], log, deadline)
            finish(by_dim[D], case)
            del case
    report["wall_s"] = time.time() - t_start
    save()
    print(markdown(report))
    sp = report.get("share_pipeline_sr") or {}
    print("pipeline share:", {k: v for k, v in sp.items() if k != "per_layer"})
    print(f"errors: {len(log)}; wall {report['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
