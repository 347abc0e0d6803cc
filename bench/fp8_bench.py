"""GPU benchmark of FP8 linear layers at the DiTs' shapes: which scaling, which kernel.

`--precision fp8` made rt720's DiT stages only 4-5% faster although FP8 GEMMs measured
1.6x bf16. This script separates the parts, per linear shape of a serving step (A2V's N
chunk, SR's segment; tokens from the config's schedule):

- the GEMM alone: bf16 `F.linear`; `torch._scaled_mm` with per-row (token x channel) scales
  or per-tensor scales, each with and without fast accumulation;
- the whole layer under torch.compile, quantisation included: dynamic per-row (the current
  `Fp8Linear`), dynamic per-tensor, and a static per-tensor activation scale (calibrated
  once, so no reduction pass over the input);

with TFLOP/s (triton.testing.do_bench, median) and the relative error against an fp32
product. Run from the repo root:

    python bench/fp8_bench.py --config rt720-low-latency --json bench/results/fp8_h200.json

`--liveavatar` takes Wan2.2-S2V-14B's linears at a block's tokens instead, and adds the
layers as modules after the op before them (Wan's modulated LayerNorm), compiled together, so
each quantisation can fuse where it would in the model: the project's `Fp8Linear` (static
per-tensor, as `--precision fp8` and `fp8-fast` run it) against torchao's float8 inference
(`quantize_` with `Float8DynamicActivationFloat8WeightConfig`, per row and per tensor; torchao
0.18 pairs with torch 2.11), the lever issue 31 asks to measure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import load_config  # noqa: E402
from pipeline.diffusion.config import latent_grid  # noqa: E402

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max


def linear_shapes(cfg) -> list[tuple[str, int, int, int]]:
    """(name, tokens M, in K, out N) of the token-wise linears of one steady step."""
    g = latent_grid(cfg)
    s = cfg.schedule
    a2v_tokens = (1 + s.boundary_latents + s.chunk_latents) * g.low_h * g.low_w
    sr_tokens = (1 + cfg.diffusion.sr.window + s.chunk_latents) * g.full_h * g.full_w
    out = []
    for model, m, dim, ratio in (
        ("a2v", a2v_tokens, cfg.diffusion.a2v.dim, cfg.diffusion.a2v.mlp_ratio),
        ("sr", sr_tokens, cfg.diffusion.sr.dim, cfg.diffusion.sr.mlp_ratio),
    ):
        hidden = int(dim * ratio)
        out += [
            (f"{model}.qkv", m, dim, 3 * dim),
            (f"{model}.out", m, dim, dim),
            (f"{model}.mlp_in", m, dim, hidden),
            (f"{model}.mlp_out", m, hidden, dim),
        ]
    return out


def liveavatar_shapes() -> list[tuple[str, int, int, int]]:
    """A LiveAvatar block's token-wise linears: its 3 latent frames' tokens (3,168 at 704x384,
    the VAE's 8x and the 2x2 patch), the self-attention's fused q/k/v and output, the
    cross-attention's q and output, the FFN's two."""
    from pipeline.models.wan.s2v import S2VConfig

    cfg = load_config("liveavatar")
    s2v = S2VConfig()
    _, ph, pw = s2v.patch_size
    tokens = s2v.frames_per_block * (cfg.video.height // 8 // ph) * (cfg.video.width // 8 // pw)
    d, f = s2v.dim, s2v.ffn_dim
    return [
        ("self.qkv", tokens, d, 3 * d),
        ("self.o", tokens, d, d),
        ("cross.q", tokens, d, d),
        ("cross.o", tokens, d, d),
        ("ffn.in", tokens, d, f),
        ("ffn.out", tokens, f, d),
    ]


def rowwise(x):
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    return (x.float() / scale).to(E4M3), scale


def tensorwise(x):
    scale = x.abs().amax().float().clamp(min=1e-12) / E4M3_MAX
    return (x.float() / scale).to(E4M3), scale


def static(x, scale):
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def _layer_rowwise(x, wq, ws, act_scale, fast):
    q, s = rowwise(x)
    return torch._scaled_mm(
        q, wq.t(), scale_a=s, scale_b=ws, out_dtype=torch.bfloat16, use_fast_accum=fast
    )


def _layer_tensorwise(x, wq, ws, act_scale, fast):
    q, s = tensorwise(x)
    return torch._scaled_mm(
        q, wq.t(), scale_a=s, scale_b=ws, out_dtype=torch.bfloat16, use_fast_accum=fast
    )


def _layer_static(x, wq, ws, act_scale, fast):
    return torch._scaled_mm(
        static(x, act_scale), wq.t(), scale_a=act_scale, scale_b=ws,
        out_dtype=torch.bfloat16, use_fast_accum=fast,
    )  # fmt: skip


# the whole layer, quantisation included, compiled once each (dynamic token counts)
LAYERS = {
    "layer_rowwise": torch.compile(_layer_rowwise, dynamic=True),
    "layer_tensorwise": torch.compile(_layer_tensorwise, dynamic=True),
    "layer_static": torch.compile(_layer_static, dynamic=True),
}


def torchao_float8(linear: torch.nn.Module, granularity: str) -> torch.nn.Module:
    """A copy of `linear` under torchao's float8 inference: activations quantised on each
    call, weights once, per row or per tensor (cuBLAS's FP8 GEMM, fast accumulation)."""
    import copy

    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        PerRow,
        PerTensor,
        quantize_,
    )

    module = torch.nn.Sequential(copy.deepcopy(linear))
    scales = PerRow() if granularity == "row" else PerTensor()
    quantize_(module, Float8DynamicActivationFloat8WeightConfig(granularity=scales))
    return module


def bench_modules(x, w, record) -> None:
    """Each layer as a module after the op before it (LayerNorm, then Wan's modulation),
    the two compiled together, against the fp32 product of the same: bf16, the project's
    `Fp8Linear` calibrated on this input (without and with fast accumulation), torchao's
    per-row and per-tensor float8."""
    from pipeline.precision import Fp8Linear

    K, N = w.shape[1], w.shape[0]
    gen = torch.Generator(device="cpu").manual_seed(1)
    shift = (0.1 * torch.randn(K, generator=gen)).to(x.device, torch.bfloat16)
    scale = (0.1 * torch.randn(K, generator=gen)).to(x.device, torch.bfloat16)
    linear = torch.nn.Linear(K, N, device=x.device, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(w)
        linear.bias.copy_((0.02 * torch.randn(N, generator=gen)).to(x.device, torch.bfloat16))

    def before(t):
        return F.layer_norm(t.float(), (K,)).to(torch.bfloat16) * (1 + scale) + shift

    with torch.no_grad():
        h = before(x)
        ref = h.float() @ w.float().t() + linear.bias.float()
        amax = h.abs().amax().float()
    modules = {
        "module_bf16": lambda: linear,
        "module_facecast_static": lambda: Fp8Linear(linear, amax),
        "module_facecast_static_fast": lambda: Fp8Linear(linear, amax, fast_accum=True),
        "module_torchao_row": lambda: torchao_float8(linear, "row"),
        "module_torchao_tensor": lambda: torchao_float8(linear, "tensor"),
    }
    for label, make in modules.items():
        try:
            module = make()
        except Exception as exc:  # torchao missing, or refusing this GPU
            record(label, None, error=f"{type(exc).__name__}: {exc}"[:200])
            continue
        # every module compiles the same lambda: without a reset, dynamo's recompile limit (8)
        # left the later shapes' modules eager (the H200's first run: 150 TFLOP/s rows)
        torch.compiler.reset()
        layer = torch.compile(lambda t, m=module: m(before(t)))
        with torch.no_grad():
            record(label, lambda layer=layer: layer(x), reference=ref)


def bench_shape(name, M, K, N, device, modules: bool = False) -> dict:
    from triton.testing import do_bench

    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, K, generator=gen).to(device, torch.bfloat16)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(device, torch.bfloat16)
    ref = x.float() @ w.float().t()
    w_scale_row = w.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    w_row = (w.float() / w_scale_row).to(E4M3)  # (N, K)
    w_scale_t = w.float().abs().amax().clamp(min=1e-12) / E4M3_MAX
    w_t = (w.float() / w_scale_t).to(E4M3)
    x_row, xs_row = rowwise(x)
    x_t, xs_t = tensorwise(x)
    w_scale_row_t = w_scale_row.t().contiguous()
    flops = 2 * M * K * N
    out: dict = {"shape": name, "M": M, "K": K, "N": N}

    def record(label, fn, reference=ref, error=None):
        if error is None:
            try:
                y = fn()
                ms = do_bench(fn, warmup=10, rep=50)
            except Exception as exc:  # a kernel this build lacks is reported, not fatal
                error = f"{type(exc).__name__}: {exc}"[:200]
        if error is not None:
            out[label] = {"error": error}
            return
        err = ((y.float() - reference).norm() / reference.norm()).item()
        out[label] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_err": err}

    record("bf16", lambda: F.linear(x, w))
    for fast in (False, True):
        tag = "_fast" if fast else ""
        record(
            f"mm_rowwise{tag}",
            lambda fast=fast: torch._scaled_mm(
                x_row, w_row.t(), scale_a=xs_row, scale_b=w_scale_row_t,
                out_dtype=torch.bfloat16, use_fast_accum=fast,
            ),
        )  # fmt: skip
        record(
            f"mm_tensorwise{tag}",
            lambda fast=fast: torch._scaled_mm(
                x_t, w_t.t(), scale_a=xs_t, scale_b=w_scale_t,
                out_dtype=torch.bfloat16, use_fast_accum=fast,
            ),
        )  # fmt: skip

    act_scale = xs_t.clone()  # calibrated once, on this input
    weights = {
        "layer_rowwise": (w_row, w_scale_row_t),
        "layer_tensorwise": (w_t, w_scale_t),
        "layer_static": (w_t, w_scale_t),
    }
    for label, fn in LAYERS.items():
        for fast in (False, True):
            tag = "_fast" if fast else ""
            wq, ws = weights[label]
            record(f"{label}{tag}", lambda fn=fn, wq=wq, ws=ws, f=fast: fn(x, wq, ws, act_scale, f))
    if modules:
        bench_modules(x, w, record)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="rt720-low-latency")
    parser.add_argument(
        "--liveavatar",
        action="store_true",
        help="LiveAvatar's linears at a block (Wan2.2-S2V-14B), each also as a module after "
        "the op before it: the project's FP8 against torchao's",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    shapes = liveavatar_shapes() if args.liveavatar else linear_shapes(load_config(args.config))
    report = {
        "config": "liveavatar" if args.liveavatar else args.config,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shapes": [],
        "command": "python " + " ".join(sys.argv),
    }
    for name, M, K, N in shapes:
        row = bench_shape(name, M, K, N, device, modules=args.liveavatar)
        report["shapes"].append(row)
        brief = {
            k: round(v["tflops"]) for k, v in row.items() if isinstance(v, dict) and "tflops" in v
        }
        print(name, M, K, N, json.dumps(brief), flush=True)
        if args.json:  # after every shape: a run cut short by its time limit keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
