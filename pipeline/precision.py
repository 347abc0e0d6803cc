"""FP8 linear layers for the DiTs, applied to a loaded engine from outside the model code.

`apply_fp8(engine)` swaps every token-wise linear layer of the A2V and SR blocks (qkv,
attention out, both MLP layers, the audio conditioning) for `Fp8Linear`: the weight kept as
float8 e4m3 with one scale per output channel, the activations quantised to e4m3 with one
scale per token, multiplied on Hopper's FP8 tensor cores by `torch._scaled_mm` with bf16
output (measured on the H200 at the DiTs' shapes: 1,048-1,273 TFLOP/s against 643-707 for
bf16). Attention, norms and the small per-chunk layers stay in bf16.

It is an opt-in precision (`--precision fp8`): it changes every product's rounding far
beyond the bf16 reassociation band the quality gate uses, so the gate gives it a tier of its
own (its PSNR against bf16, reported, with a floor). What a user gives up is in
bench/RESULTS.md.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


class Fp8Linear(nn.Module):
    """y = x W^T + b with W and x in e4m3, scaled per output channel and per token."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX  # (out, 1)
        self.register_buffer("weight", (w / scale).to(torch.float8_e4m3fn))  # (out, in)
        self.register_buffer("weight_scale", scale.t().contiguous())  # (1, out), fp32
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.out_features = linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        x_MK = x.reshape(-1, x.shape[-1])
        scale_M1 = x_MK.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
        x_fp8 = (x_MK.float() / scale_M1).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(
            x_fp8,
            self.weight.t(),  # column-major (in, out), as the FP8 kernels want it
            scale_a=scale_M1,
            scale_b=self.weight_scale,
            out_dtype=x.dtype,
        )
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def fp8_supported(device: torch.device) -> bool:
    """FP8 tensor cores: compute capability 8.9 (Ada) or 9.0+ (Hopper)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def apply_fp8(engine) -> int:
    """Swap the DiT blocks' token-wise linears for `Fp8Linear`; returns how many."""
    from pipeline.errors import ConfigError

    if not fp8_supported(engine.device):
        raise ConfigError("--precision fp8 needs an FP8 GPU (compute capability 8.9 or 9.0+)")
    if engine.offloader is not None:
        raise ConfigError("--precision fp8 does not combine with --offload yet")
    count = 0
    for name in ("a2v", "sr"):
        for block in engine.modules[name].model.transformer.blocks:
            attn = block.attn
            attn.qkv, attn.out = Fp8Linear(attn.qkv), Fp8Linear(attn.out)
            block.mlp[0], block.mlp[2] = Fp8Linear(block.mlp[0]), Fp8Linear(block.mlp[2])
            count += 4
            if block.cond is not None:
                block.cond = Fp8Linear(block.cond)
                count += 1
    engine.precision = "fp8"
    return count
