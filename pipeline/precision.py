"""FP8 linear layers for the DiTs, applied to a loaded engine from outside the model code.

`apply_fp8(engine, scaling)` swaps token-wise linear layers of the A2V and SR blocks for
`Fp8Linear`, weights kept as float8 e4m3, multiplied on Hopper's FP8 tensor cores by
`torch._scaled_mm` with bf16 output. Two ways to scale the activations:

- `static` (`--precision fp8`): one scale per layer, calibrated at start-up from the
  largest input that layer saw over a throwaway session of every chunk shape, with
  `STATIC_HEADROOM` to spare (an input beyond it saturates at e4m3's largest value). The
  quantisation is then one multiply and cast that Inductor fuses into the op before the
  layer: measured 1,000-1,160 TFLOP/s for the whole layer at the DiTs' big shapes against
  690-760 for bf16 (bench/fp8_bench.py). Weights are scaled per tensor, as cuBLAS's
  per-tensor FP8 GEMM needs. The attention output projection stays bf16: its input comes
  from the attention kernel, outside the compiled graph, and a separate quantisation pass
  made it slower than bf16 (A2V: 440 against 700 TFLOP/s).
- `static` with `fast_accum` (`--precision fp8-fast`): as `static`, the GEMMs in Hopper's
  fast accumulation mode (cuBLAS's FP8 GEMMs then skip the periodic promotion of partial
  sums to full fp32; torchao runs its float8 inference so), faster and less exact: the
  gate's FP8 tier says whether a model keeps its picture.
- `row` (`--precision fp8-rowwise`): per-token activation and per-channel weight scales
  computed on every call. Nothing to calibrate, but the absolute-max pass over each input
  costs what FP8 saves (670-900 TFLOP/s, slower than bf16 on the small layers).

An FFN's tanh-GELU in front of an FP8 linear becomes `TanhGelu` (the same function): compiled,
it is computed in its logistic form, which keeps the GELU + quantisation pass at the speed of
its bytes rather than of libdevice's tanh.

Attention, norms and the small per-chunk layers stay in bf16. FP8 is an opt-in precision:
it changes every product's rounding far beyond the bf16 reassociation band the quality gate
uses, so the gate gives it a tier of its own (its PSNR against bf16, reported, with a
floor). What a user gives up is in bench/RESULTS.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


STATIC_HEADROOM = 4.0  # two binades above the largest calibrated input: e4m3's precision
# is relative, so headroom costs only the subnormal range at the very bottom


def scaled_e4m3(x: Tensor, descale: Tensor) -> Tensor:
    """x / descale, saturated at e4m3's largest value, rounded to e4m3."""
    if torch.compiler.is_compiling() and x.is_cuda:
        return scaled_e4m3_on_gpu(x, descale)
    return (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def scaled_e4m3_on_gpu(x: Tensor, descale: Tensor) -> Tensor:
    """`scaled_e4m3` as compiled for an NVIDIA GPU. The conversion saturates by itself there
    (PTX converts to FP8 only with `satfinite`), and one reciprocal serves every element:
    the clamp and the division were ~7 of the ~14 instructions an element of a quantisation
    pass (`bench/kernel_instructions.py`). Eager torch's conversion makes NaN of what is
    past 448 instead, hence the clamp elsewhere."""
    return (x.float() * torch.reciprocal(descale)).to(torch.float8_e4m3fn)


def widened_e4m3(x8: Tensor, descale: Tensor, dtype: torch.dtype) -> Tensor:
    """The values e4m3 `x8` stands for (x8 x descale), in `dtype`."""
    return (x8.float() * descale).to(dtype)


class Fp8Linear(nn.Module):
    """y = x W^T + b with W and x in e4m3: per-token activation and per-channel weight
    scales computed on each call (`input_amax` None), or one static scale for each."""

    # buffers (register_buffer below)
    weight: Tensor  # (out, in) e4m3
    weight_scale: Tensor  # () static, (1, out) per channel; fp32
    input_scale: Tensor  # () static only
    bias: Tensor | None

    def __init__(
        self, linear: nn.Linear, input_amax: Tensor | None = None, fast_accum: bool = False
    ) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        self.static = input_amax is not None
        self.fast_accum = fast_accum
        if input_amax is not None:
            scale = w.abs().amax().clamp(min=1e-12) / E4M3_MAX  # one for the tensor
            self.register_buffer("weight_scale", scale)
            amax = input_amax.detach().float().clamp(min=1e-12)
            self.register_buffer("input_scale", amax * STATIC_HEADROOM / E4M3_MAX)
        else:
            scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX  # (out, 1)
            self.register_buffer("weight_scale", scale.t().contiguous())  # (1, out), fp32
        self.register_buffer("weight", (w / scale).to(torch.float8_e4m3fn))  # (out, in)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.out_features = linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        # row-major, as the FP8 GEMM takes its left operand: a block's first tokens are a
        # transposed view, and elementwise work before this (a norm, compiled) keeps that
        x_MK = x.reshape(-1, x.shape[-1]).contiguous()
        if self.static:
            scale = self.input_scale
            x_fp8 = scaled_e4m3(x_MK, scale)
        else:
            scale = x_MK.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
            x_fp8 = (x_MK.float() / scale).to(torch.float8_e4m3fn)
        # The bias rides in the GEMM's epilogue where the kernels take it (a bf16 bias for a
        # bf16 output: cuBLASLt's per-tensor path and CUTLASS's per-row one). Added apart it is
        # one more pass over the output; on the H200 that pass was the 41 us by which torchao's
        # float8 beat this layer on LiveAvatar's qkv. With it here, this layer is ahead of
        # torchao's on all five shapes measured (bench/RESULTS.md, issue 31).
        in_epilogue = self.bias is not None and self.bias.dtype == x.dtype == torch.bfloat16
        y = torch._scaled_mm(
            x_fp8,
            self.weight.t(),  # column-major (in, out), as the FP8 kernels want it
            scale_a=scale,
            scale_b=self.weight_scale,
            bias=self.bias if in_epilogue else None,
            out_dtype=x.dtype,
            use_fast_accum=self.fast_accum,
        )
        if self.bias is not None and not in_epilogue:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


# 2·sqrt(2/π) and 2·sqrt(2/π)·0.044715: GELU's tanh form ½(1 + tanh u), u = sqrt(2/π)(x +
# 0.044715x³), is σ(2u)
GELU_LINEAR = 1.5957691216057308
GELU_CUBIC = 0.07135481627260025


def logistic_tanh_gelu(x: Tensor) -> Tensor:
    """GELU's tanh form, computed as x·σ(2u) in float32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.sigmoid(xf * (GELU_LINEAR + GELU_CUBIC * xf * xf))).to(x.dtype)


class TanhGelu(nn.Module):
    """`nn.GELU(approximate="tanh")`, the same function, written for the compiler.

    Compiled for a GPU, the tanh lowers to libdevice's accurate tanhf; with the FP8
    quantisation fused after it that was ~38 instructions an element, and the FFN's GELU +
    quantisation pass became instruction-bound: 0.139 ms for FlashHead Pro's 83 M elements
    on the H200, 2.7x what its bytes take (bench/RESULTS.md, issue 30). As x·σ(2u) it takes
    the GPU's fast exponential instead: ~22 with `scaled_e4m3_on_gpu`
    (`bench/kernel_instructions.py`). Eager, where each op would be a kernel of its own, it
    stays torch's one GELU kernel."""

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return logistic_tanh_gelu(x)
        return F.gelu(x, approximate="tanh")


def logistic_gelus(layers: list[tuple[nn.Module, str]]) -> int:
    """Swap each tanh-GELU that feeds one of these linears directly (an FFN's
    `Sequential(linear, GELU, linear)`) for `TanhGelu`; returns how many."""
    swapped = 0
    for parent, attr in layers:
        if not (isinstance(parent, nn.Sequential) and attr.isdigit() and int(attr) > 0):
            continue
        before = parent[int(attr) - 1]
        if isinstance(before, nn.GELU) and before.approximate == "tanh":
            parent[int(attr) - 1] = TanhGelu()
            swapped += 1
    return swapped


def fp8_supported(device: torch.device) -> bool:
    """FP8 tensor cores: compute capability 8.9 (Ada) or 9.0+ (Hopper)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


SCALINGS = ("static", "row")


def fp8_layers(engine, scaling: str) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of every linear layer FP8 replaces: the family's choice
    (`engine.fp8_targets`), the token-wise linears of its DiT blocks."""
    return engine.fp8_targets(scaling)


def calibrate_input_amax(engine, linears: list[nn.Linear]) -> dict[nn.Module, Tensor]:
    """The largest |input| each layer sees over one throwaway session of every chunk
    shape (the warm-up's), recorded by forward pre-hooks on the bf16 layers."""
    amax: dict[nn.Module, Tensor] = {lin: torch.zeros((), device=engine.device) for lin in linears}

    def record(module: nn.Module, args: tuple) -> None:
        torch.maximum(amax[module], args[0].detach().abs().amax().float(), out=amax[module])

    handles = [lin.register_forward_pre_hook(record) for lin in linears]
    try:
        engine.run_every_shape()
    finally:
        for handle in handles:
            handle.remove()
    return amax


def require_fp8(device: torch.device) -> None:
    """ConfigError unless `device` has FP8 tensor cores."""
    from pipeline.errors import ConfigError

    if not fp8_supported(device):
        raise ConfigError("--precision fp8 needs an FP8 GPU (compute capability 8.9 or 9.0+)")


def apply_fp8(
    engine, scaling: str = "static", emulate: bool = False, fast_accum: bool = False
) -> int:
    """Swap the DiT blocks' token-wise linears for `Fp8Linear`; returns how many.
    `emulate` allows any device: torch's reference kernels compute the same e4m3 products,
    slowly, which is enough to measure what FP8 does to quality (bench/fp8_quality.py).
    `fast_accum`: the GEMMs in the fast accumulation mode (a GPU's; the CPU's reference
    kernels accumulate exactly either way)."""
    from pipeline.errors import ConfigError

    if scaling not in SCALINGS:
        raise ConfigError(f"FP8 scaling {scaling!r} is not one of {', '.join(SCALINGS)}")
    if not emulate:
        require_fp8(engine.device)
    if engine.offloader is not None:
        raise ConfigError("--precision fp8 does not combine with --offload yet")
    layers = fp8_layers(engine, scaling)
    amax = None
    if scaling == "static":
        amax = calibrate_input_amax(engine, [getattr(p, a) for p, a in layers])
    for parent, attr in layers:
        linear = getattr(parent, attr)
        layer_amax = amax[linear] if amax is not None else None
        setattr(parent, attr, Fp8Linear(linear, layer_amax, fast_accum=fast_accum))
    logistic_gelus(layers)
    engine.precision = f"fp8-{scaling}" + ("-fast" if fast_accum else "")
    engine.precision_applied()  # e.g. LiveAvatar's attention in 8 bits as well
    return len(layers)
