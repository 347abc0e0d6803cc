"""The Wan 2.x layers that FlashHead's DiT and LiveAvatar's S2V transformer share.

Both networks are Wan DiTs: attention weights laid out as Wan publishes them, with
RMS-normed queries and keys (`WanSelfAttention`, `WanCrossAttention`), Wan's timestep
sinusoid, and a cross-attention of each latent frame's tokens to that frame's audio tokens
(FlashHead's every block, S2V's audio injection). `wan_fp8_targets` names the linears FP8 replaces in
either's blocks. RoPE is the project's one `pipeline.models.layers.apply_rope`.

Legend: B batch, L tokens, T latent frames, P tokens per latent frame, M audio tokens per
latent frame, G groups (B*T), D model width, N heads, H head dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.attention import Attention


class RMSNorm(nn.Module):
    """RMS norm over the whole width, computed in fp32, weight applied in the input dtype
    (the published model's order of operations)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * (
            self.weight
        )


def sinusoid(t_B: Tensor, dim: int) -> Tensor:
    """Wan's timestep features: cos then sin, position t itself (not scaled), in fp64."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t_B.device) / half)
    args = torch.outer(t_B.double(), freqs)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


class WanSelfAttention(nn.Module):
    """Self-attention's weights as Wan publishes them (q, k, v fused at load): RMS norms over
    the whole width on queries and keys. Each model says how its tokens attend."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)
        self.attend = Attention("sdpa")


class WanCrossAttention(nn.Module):
    """Cross-attention's weights as Wan publishes them (k, v fused at load): queries from
    the tokens, keys and values from a context, RMS norms on queries and keys."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)


class FrameCrossAttention(WanCrossAttention):
    """Each latent frame's tokens attend to that frame's audio tokens, and nothing else."""

    def forward(self, x_BLD: Tensor, ctx_BTMD: Tensor) -> Tensor:
        B, L, D = x_BLD.shape
        T, M, N = ctx_BTMD.shape[1], ctx_BTMD.shape[2], self.heads
        x_GPD = x_BLD.reshape(B * T, L // T, D)  # G = B*T groups: one per latent frame
        k, v = self.kv(ctx_BTMD.reshape(B * T, M, D)).chunk(2, dim=-1)
        q_GNPH = self.norm_q(self.q(x_GPD)).unflatten(-1, (N, -1)).transpose(1, 2)
        k_GNMH = self.norm_k(k).unflatten(-1, (N, -1)).transpose(1, 2)
        v_GNMH = v.unflatten(-1, (N, -1)).transpose(1, 2)
        o_GNPH = F.scaled_dot_product_attention(q_GNPH, k_GNMH, v_GNMH)
        return self.o(o_GNPH.transpose(1, 2).reshape(B, L, D))


def wan_fp8_targets(
    blocks: Sequence[nn.Module], scaling: str, outputs: bool = False
) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of the linears FP8 replaces in Wan-style blocks (FlashHead's,
    S2V's): self-attention's fused q/k/v, the cross-attention's q and the FFN's two, all
    token-wise; also the two attention output projections with per-row scales, or when
    `outputs` says so (a block whose output projections sit inside its compiled graph,
    where their inputs' quantisation fuses into the reshape before them)."""
    out: list[tuple[nn.Module, str]] = []
    for block in blocks:
        self_attn, cross_attn, ffn = block.self_attn, block.cross_attn, block.ffn
        assert isinstance(self_attn, nn.Module) and isinstance(cross_attn, nn.Module)
        assert isinstance(ffn, nn.Module)
        out += [(self_attn, "qkv"), (cross_attn, "q")]
        if scaling == "row" or outputs:
            out += [(self_attn, "o"), (cross_attn, "o")]
        out += [(ffn, "0"), (ffn, "2")]
    return out
