"""One layer of LiveAvatar's S2V transformer (`pipeline.models.wan.s2v`), and its head.

A layer is Wan's: six-way modulation from the timestep (per latent frame: each of the T
groups of L/T tokens has its own row), self-attention with RMS-normed queries and keys and
RoPE, whose keys and values go through the stream's cache (`pipeline.models.wan.s2v_cache`:
`KeyValues`), the prompt's cross-attention (its keys and values projected once per
stream), and a tanh-GELU FFN. The residual stream stays fp32 inside a layer, as the
authors' code keeps it.

Legend: B batch, T latent frames, L tokens, D model width, N heads, K head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.kernels.fp8_attention import per_tensor_e4m3
from pipeline.models.attention import Attention, cached_fp8_attention, e4m3_attention
from pipeline.models.layers import LayerNorm, apply_rope, layer_norm
from pipeline.models.wan.layers import WanCrossAttention, WanSelfAttention
from pipeline.models.wan.s2v_audio import linear32
from pipeline.models.wan.s2v_cache import Attended, KeyValues
from pipeline.models.wan.s2v_sink import Rope
from pipeline.precision import widened_e4m3

Queries8 = tuple[Tensor, Tensor]  # queries in e4m3 (B, N, L, K) and their descale (1, 1, 1, 1)


class CausalSelfAttention(WanSelfAttention):
    """A block's tokens attend to the sink and the cached blocks (`Attended`: from the
    cache), so projecting and attending are two steps."""

    # Set where cuDNN's FP8 kernel reads an FP8 cache (`liveavatar.attention: fp8` with
    # `kv_cache: fp8`): the queries are then quantised in `project`, inside the layer's
    # compiled half where it fuses with RoPE, and O is widened in the other half; on the
    # H200 quantising q and widening O around each kernel call were 0.39 ms of its 1.62.
    fp8_queries: bool = False

    def project(
        self, x_BLD: Tensor, rope: Rope
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Queries8 | None]:
        """Queries (B, N, L, K) rotated; keys (B, L, N, K) normed before RoPE; keys rotated
        and values (B, N, L, K), contiguous: written so inside the layer's compiled half,
        they go into the cache's heads-first buffers as plain copies (a transposing copy of
        each was ~26 ms of a LiveAvatar block on the H200); and with `fp8_queries`, the
        queries in e4m3 as well (the full-precision ones stay for a kernel that declines)."""
        B, L, _ = x_BLD.shape
        q, k, v = self.qkv(x_BLD).chunk(3, dim=-1)
        q_BLNK = apply_rope(self.norm_q(q).view(B, L, self.heads, -1), *rope, tokens_first=True)
        k_BLNK = self.norm_k(k).view(B, L, self.heads, -1)
        k_BNLK = apply_rope(k_BLNK, *rope, tokens_first=True).transpose(1, 2).contiguous()
        v_BNLK = v.view(B, L, self.heads, -1).transpose(1, 2).contiguous()
        q_BNLK = q_BLNK.transpose(1, 2)
        q8 = per_tensor_e4m3(q_BNLK) if self.fp8_queries else None
        return q_BNLK, k_BLNK, k_BNLK, v_BNLK, q8

    def attend_to(
        self, q_BNLK: Tensor, kv: Attended, q8: Queries8 | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """The attention's output (B, N, L, K), and its descale where it is in e4m3 (cuDNN's
        FP8 kernel over an FP8 cache, given the queries in e4m3), else None."""
        if kv.mask is not None:  # the full-sequence reference path only
            return F.scaled_dot_product_attention(q_BNLK, kv.k, kv.v, attn_mask=kv.mask), None
        if kv.descales is not None and self.attend.backend == "fp8":
            # an FP8 cache read as it is stored
            if q8 is not None:
                out8 = e4m3_attention(q_BNLK, *q8, kv.k, kv.v, *kv.descales)
                if out8 is not None:
                    return out8
            else:  # the queries are quantised for the call
                out = cached_fp8_attention(q_BNLK, kv.k, kv.v, *kv.descales)
                if out is not None:
                    return out, None
        k, v = kv.widened(q_BNLK.dtype)
        return self.attend(q_BNLK, k, v), None


class TextCrossAttention(WanCrossAttention):
    """Every token attends to the prompt's tokens. The prompt is fixed for a stream, so its
    keys and values are projected once (`context_kv`, at prefill) and kept in the cache."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__(dim, heads, eps)
        self.attend = Attention("sdpa")

    def context_kv(self, ctx_BMD: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.kv(ctx_BMD).chunk(2, dim=-1)
        k_BNMK = self.norm_k(k).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        return k_BNMK, v.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x_BLD: Tensor, kv: tuple[Tensor, Tensor]) -> Tensor:
        B, L, D = x_BLD.shape
        q_BNLK = self.norm_q(self.q(x_BLD)).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        o_BNLK = self.attend(q_BNLK, *kv)
        return self.o(o_BNLK.transpose(1, 2).reshape(B, L, D))


class S2VBlock(nn.Module):
    """One layer: self-attention through the cache, the prompt's cross-attention, the FFN,
    each modulated per latent frame (six-way, from the timestep)."""

    def __init__(self, d: int, ffn_dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.self_attn = CausalSelfAttention(d, heads, eps)
        self.norm3 = LayerNorm(d, eps=eps)
        self.cross_attn = TextCrossAttention(d, heads, eps)
        self.ffn = nn.Sequential(
            nn.Linear(d, ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, d)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, d) / d**0.5)

    def forward(
        self,
        x_BLD: Tensor,
        mod_BT6D: Tensor,
        rope: Rope,
        text_kv: tuple[Tensor, Tensor],
        kv: KeyValues,
        layer: int,
    ) -> Tensor:
        """One layer; `mod_BT6D` (fp32) modulates each of the T groups of L/T tokens. The
        dense work before and after the cache is in two methods of fixed shapes, which
        `compile` compiles; the cache's reads and writes (Python offsets that change from
        block to block) and the attention stay outside them."""
        mod_BT6D = self.modulation.float()[:, None] + mod_BT6D
        q_BNLK, k_BLNK, k_rot, v_BNLK, q8 = self.before_attention(x_BLD, mod_BT6D, rope)
        attended = kv(layer, k_BLNK, k_rot, v_BNLK)
        o_BNLK, o_descale = self.self_attn.attend_to(q_BNLK, attended, q8)
        return self.after_attention(x_BLD, o_BNLK, o_descale, mod_BT6D, text_kv)

    def before_attention(
        self, x_BLD: Tensor, mod_BT6D: Tensor, rope: Rope
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Queries8 | None]:
        shift, scale = mod_BT6D[:, :, 0, None], mod_BT6D[:, :, 1, None]
        h_BLD = modulate(layer_norm(x_BLD, self.eps), shift, scale, x_BLD.dtype)
        return self.self_attn.project(h_BLD, rope)

    def after_attention(
        self,
        x_BLD: Tensor,
        o_BNLK: Tensor,
        o_descale: Tensor | None,
        mod_BT6D: Tensor,
        text_kv: tuple[Tensor, Tensor],
    ) -> Tensor:
        """The rest of the layer; an O in e4m3 (`o_descale` not None) is widened here, in
        the same pass as the reshape before the output projection."""
        B, L, D = x_BLD.shape
        dtype = x_BLD.dtype
        if o_descale is not None:
            o_BNLK = widened_e4m3(o_BNLK, o_descale, dtype)
        gate1, shift2, scale2, gate2 = (mod_BT6D[:, :, i, None] for i in range(2, 6))
        y = self.self_attn.o(o_BNLK.transpose(1, 2).reshape(B, L, D))
        # the residual stream stays fp32 inside a layer and is rounded at its end (authors')
        x = x_BLD.float() + gated(y, gate1)
        # the authors' layer hands norm3 its input rounded to bf16, in any dtype
        h = self.norm3(x.to(torch.bfloat16)).to(dtype)
        x = x + self.cross_attn(h, text_kv).float()
        y = self.ffn(modulate(layer_norm(x, self.eps), shift2, scale2, dtype))
        return (x + gated(y, gate2)).to(dtype)


def modulate(h_BLD: Tensor, shift_BT1D: Tensor, scale_BT1D: Tensor, dtype: torch.dtype) -> Tensor:
    """(1 + scale) h + shift in fp32, each of the T groups of L/T tokens by its own row."""
    B, L, D = h_BLD.shape
    T = shift_BT1D.shape[1]
    h = h_BLD.float().view(B, T, L // T, D) * (1 + scale_BT1D) + shift_BT1D
    return h.view(B, L, D).to(dtype)


def gated(y_BLD: Tensor, gate_BT1D: Tensor) -> Tensor:
    """gate y in fp32, each of the T groups of L/T tokens by its own row."""
    B, L, D = y_BLD.shape
    T = gate_BT1D.shape[1]
    return (y_BLD.float().view(B, T, L // T, D) * gate_BT1D).view(B, L, D)


class FrameHead(nn.Module):
    """The output projection, modulated per latent frame (two-way, from the timestep);
    `out` = latent channels x patch volume."""

    def __init__(self, d: int, out: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.head = nn.Linear(d, out)
        self.modulation = nn.Parameter(torch.randn(1, 2, d) / d**0.5)

    def forward(self, x_BLD: Tensor, e_BTD: Tensor) -> Tensor:
        B, L, D = x_BLD.shape
        T = e_BTD.shape[1]
        shift, scale = (self.modulation.float()[:, None] + e_BTD[:, :, None]).unbind(2)
        h = layer_norm(x_BLD, self.eps).float().view(B, T, L // T, D)
        h = h * (1 + scale[:, :, None]) + shift[:, :, None]
        return linear32(self.head, h.view(B, L, D))
