"""Building blocks shared by the two DiTs: 3D RoPE, adaLN modulation, the transformer block.

`apply_rope` is every model's RoPE, the Wan models' too (`pipeline.models.wan`, FlashHead's
DiT: tokens first).

Legend: B batch, L tokens, D model dim, N heads, H head dim, T latent frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.attention import Attention, FrameWindow


def layer_norm(
    x: Tensor, eps: float, weight: Tensor | None = None, bias: Tensor | None = None
) -> Tensor:
    """LayerNorm over the last dim, in float32, returned in x's dtype.

    Eager it is torch's kernel. Compiled it is written as two plain passes, the mean and then
    the mean square of the centred values: Inductor lowers torch's own LayerNorm to
    Welford's running update, a division an element and a division at every step of its
    cross-lane tree, ~73 instructions an element of Hopper code against ~39 for the two
    passes (`bench/kernel_instructions.py`); FlashHead Pro's LayerNorm + modulation + FP8
    kernels ran at 4-7x their bytes on the H200. Centred first, it is as exact as torch's."""
    if not torch.compiler.is_compiling():
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    # row-major whatever x's strides, as torch's returns it (a DiT's first tokens are a
    # transposed view; the linear after takes the rows)
    xf = x.contiguous().float()
    centred = xf - xf.mean(-1, keepdim=True)
    y = centred * torch.rsqrt((centred * centred).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` over the last dim (the same parameters, the same checkpoint keys),
    computed by `layer_norm`."""

    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__(dim, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.eps, self.weight, self.bias)


def rope_axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Split a head dim into even (t, h, w) parts; time gets the remainder."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def rope_angles(positions_L3: Tensor, head_dim: int, theta: float = 10000.0) -> Tensor:
    """Rotation angles (L, H/2) for integer (t, h, w) positions of each token."""
    parts = []
    for axis, dim in enumerate(rope_axis_dims(head_dim)):
        freqs = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        parts.append(positions_L3[:, axis, None].double() * freqs[None, :])
    return torch.cat(parts, dim=-1).float()


def apply_rope(x: Tensor, cos_LH: Tensor, sin_LH: Tensor, tokens_first: bool = False) -> Tensor:
    """Rotate adjacent channel pairs (x1, x2) by each token's angles (cos/sin: (L, H/2)) to
    (x1 cos - x2 sin, x2 cos + x1 sin), in fp32; `x` heads first (B, N, L, H), or tokens
    first (B, L, N, H) as the Wan models hold it.

    Written as x cos + swapped(x) (-sin, sin), which rounds as the pairwise form does (a
    negation and the order of an addition are exact), so that Inductor makes it one
    elementwise pass: a `torch.stack` of the two halves compiles to a float32 buffer
    written pair by pair and a second pass that narrows it, 14 bytes an element moved
    against 4 (`bench/kernel_instructions.py`: q's norm + RoPE, three kernels then one)."""
    cos_L1H1, sin_L1H1 = cos_LH[..., None], sin_LH[..., None]
    if tokens_first:
        cos_L1H1, sin_L1H1 = cos_L1H1[:, None], sin_L1H1[:, None]
    pairs = x.float().unflatten(-1, (-1, 2))
    signs = torch.tensor([-1.0, 1.0], device=x.device)
    out = pairs * cos_L1H1 + pairs.flip(-1) * (sin_L1H1 * signs)
    return out.flatten(-2).type_as(x)


def grid_positions(t: int, h: int, w: int, t_offset: int = 0) -> Tensor:
    """(t*h*w, 3) integer positions in frame-major, row-major token order."""
    tt, hh, ww = torch.meshgrid(
        torch.arange(t) + t_offset, torch.arange(h), torch.arange(w), indexing="ij"
    )
    return torch.stack([tt, hh, ww], dim=-1).reshape(-1, 3)


def timestep_embedding(t_B: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t_B.device) / half)
    args = t_B.float()[:, None] * 1000.0 * freqs[None, :]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x_BLD: Tensor, shift_BD: Tensor, scale_BD: Tensor) -> Tensor:
    return x_BLD * (1 + scale_BD[:, None, :]) + shift_BD[:, None, :]


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, backend: str) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.RMSNorm(dim // heads, eps=1e-6)
        self.k_norm = nn.RMSNorm(dim // heads, eps=1e-6)
        self.out = nn.Linear(dim, dim)
        # a seam: sequence parallelism wraps it (pipeline/parallel/ulysses.py)
        self.attend: nn.Module = Attention(backend)

    def forward(self, x_BLD: Tensor, rope: tuple[Tensor, Tensor], window: FrameWindow | None):
        B, L, D = x_BLD.shape
        q, k, v = self.qkv(x_BLD).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(self.q_norm(q), *rope), apply_rope(self.k_norm(k), *rope)
        o_BNLH = self.attend(q, k, v, window)
        return self.out(o_BNLH.transpose(1, 2).reshape(B, L, D))


class DiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-style shift/scale/gate modulation.

    The modulation vector comes from outside (timestep MLP) plus a learned per-block table,
    so one shared projection serves every block (fewer parameters than a per-block MLP).
    An optional per-frame conditioning vector (audio) is added to every token of its frame.
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: float, backend: str, cond_dim: int = 0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(dim, heads, backend)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim)
        )
        self.modulation = nn.Parameter(torch.randn(6, dim) / dim**0.5)
        self.cond = nn.Linear(cond_dim, dim) if cond_dim else None

    def forward(self, x_BLD, mod_B6D, rope, window=None, cond_BLC=None):
        shift1, scale1, gate1, shift2, scale2, gate2 = (mod_B6D + self.modulation).unbind(1)
        if self.cond is not None and cond_BLC is not None:
            x_BLD = x_BLD + self.cond(cond_BLC)
        h = self.attn(modulate(self.norm1(x_BLD), shift1, scale1), rope, window)
        x_BLD = x_BLD + gate1[:, None, :] * h
        h = self.mlp(modulate(self.norm2(x_BLD), shift2, scale2))
        return x_BLD + gate2[:, None, :] * h


class BlockStack(nn.Module):
    """The DiT's transformer blocks run in order. A seam on purpose: parallelism (sequence
    sharding) and offload wrap or hook this stack from outside; the model stays unchanged."""

    def __init__(self, blocks: list[DiTBlock]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x_BLD, mod_B6D, rope, window=None, cond_BLD=None):
        for block in self.blocks:
            x_BLD = block(x_BLD, mod_B6D, rope, window, cond_BLD)
        return x_BLD


class FinalLayer(nn.Module):
    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.modulation = nn.Parameter(torch.randn(2, dim) / dim**0.5)
        self.linear = nn.Linear(dim, out_dim)

    def forward(self, x_BLD: Tensor, emb_BD: Tensor) -> Tensor:
        shift, scale = (emb_BD[:, None, :] + self.modulation).unbind(1)
        return self.linear(modulate(self.norm(x_BLD), shift, scale))


def silu_linear(dim_in: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(nn.SiLU(), nn.Linear(dim_in, dim_out))


def gelu_mlp(dim_in: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim_in, dim_out), nn.GELU(approximate="tanh"), nn.Linear(dim_out, dim_out)
    )
