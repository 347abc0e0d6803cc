"""SoulX-FlashHead's transformer: the Wan 2.1 DiT core with per-frame audio cross-attention.

One forward denoises a chunk's latents. The input is the noisy latents and the reference
image's latents concatenated on the channel axis, patchified 1x2x2 into tokens; each of
the `layers` blocks is six-way adaLN modulation from the timestep, self-attention with
RMS-normed queries and keys and 3-D RoPE, cross-attention of each latent frame's tokens to
that frame's audio tokens only, and a tanh-GELU FFN. Audio enters as per-video-frame
wav2vec2 features (a 5-frame window of 12 hidden layers each), which `AudioProjection`
turns into `context_tokens` tokens per latent frame; it runs once per chunk
(`project_audio`), not once per sampling step, since it does not depend on the timestep.

Parameter names follow the published checkpoint (`Model_Pro/`, `Model_Lite/`) so that the
loader's mapping table stays short; self-attention's q, k, v and cross-attention's k, v
are fused into one matrix each at load time (`pipeline.flashhead.weights`). The layers
it shares with LiveAvatar's S2V transformer live in `pipeline.models.wan.layers`.

Legend: B batch, C latent channels, T latent frames, F video frames, W audio window,
S wav2vec2 layers, A wav2vec2 width, L tokens, P tokens per latent frame, M audio tokens
per latent frame, D model width, N heads, H head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from pipeline.kernels.fp8_attention import per_sample_e4m3
from pipeline.models.attention import e4m3_attention_per_sample
from pipeline.models.layers import LayerNorm, apply_rope, grid_positions, rope_angles
from pipeline.models.wan.layers import FrameCrossAttention, WanSelfAttention, sinusoid
from pipeline.precision import widened_e4m3


@dataclass(frozen=True)
class WanDiTConfig:
    """The fields of the release's `config.json` that shape the network."""

    dim: int = 1536
    in_dim: int = 32  # noisy latents + reference latents
    ffn_dim: int = 8960
    out_dim: int = 16
    text_dim: int = 4096  # the release keeps a text embedding it never uses
    freq_dim: int = 256
    eps: float = 1e-6
    vae_stride: tuple[int, int, int] = (4, 8, 8)
    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_heads: int = 12
    num_layers: int = 30
    # fixed by the authors' code, not in config.json
    audio_dim: int = 768  # wav2vec2-base width
    audio_layers: int = 12  # hidden states stacked per frame
    audio_window: int = 5  # video frames of audio per frame (centre ±2)
    audio_hidden: int = 512
    context_tokens: int = 32

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def frames_per_latent(self) -> int:
        return self.vae_stride[0]


class SelfAttention(WanSelfAttention):
    """Every token attends to every token of the chunk."""

    # Set where cuDNN's FP8 attention runs (`flashhead.attention: fp8`, placed by the engine):
    # q, k and v are then quantised here, in the block's compiled graph where it fuses with
    # the norms and RoPE, and the e4m3 O is widened here, fused with the reshape before the
    # output projection. Quantised around each kernel call they would cost as much again as
    # the kernel (1.19 ms beside its 1.37 at LiveAvatar's shape on the H200).
    fp8_inputs: bool = False

    def forward(self, x_BLD: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        B, L, D = x_BLD.shape
        q, k, v = self.qkv(x_BLD).chunk(3, dim=-1)
        N = self.heads
        q_BLNH = apply_rope(self.norm_q(q).view(B, L, N, -1), *rope, tokens_first=True)
        k_BLNH = apply_rope(self.norm_k(k).view(B, L, N, -1), *rope, tokens_first=True)
        q_BNLH, k_BNLH = q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2)
        v_BNLH = v.view(B, L, N, -1).transpose(1, 2)
        o_BNLH = self.attend_in_fp8(q_BNLH, k_BNLH, v_BNLH) if self.fp8_inputs else None
        if o_BNLH is None:
            o_BNLH = self.attend(q_BNLH, k_BNLH, v_BNLH)
        return self.o(o_BNLH.transpose(1, 2).reshape(B, L, D))

    def attend_in_fp8(self, q_BNLH: Tensor, k_BNLH: Tensor, v_BNLH: Tensor) -> Tensor | None:
        """cuDNN's FP8 attention: q, k and v scaled into e4m3 by one scale each for each
        stream of the batch (a batch of sessions gives each one its frames alone), O widened
        back to q's dtype; None where the kernel declines (said once), for the exact path."""
        quantised = [per_sample_e4m3(x) for x in (q_BNLH, k_BNLH, v_BNLH)]
        (q8, descale_q), (k8, descale_k), (v8, descale_v) = quantised
        out = e4m3_attention_per_sample(q_BNLH, q8, descale_q, k8, v8, descale_k, descale_v)
        if out is None:
            return None
        o8, descale_o = out
        return widened_e4m3(o8, descale_o, q_BNLH.dtype)


class AudioBlock(nn.Module):
    def __init__(self, cfg: WanDiTConfig) -> None:
        super().__init__()
        d, eps = cfg.dim, cfg.eps
        self.norm1 = LayerNorm(d, eps=eps, elementwise_affine=False)
        self.self_attn = SelfAttention(d, cfg.num_heads, eps)
        self.norm3 = LayerNorm(d, eps=eps)
        self.cross_attn = FrameCrossAttention(d, cfg.num_heads, eps)
        self.norm2 = LayerNorm(d, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(d, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, d)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, d) / d**0.5)

    def forward(
        self, x_BLD: Tensor, ctx_BTMD: Tensor, mod_B6D: Tensor, rope: tuple[Tensor, Tensor]
    ) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + mod_B6D).chunk(6, dim=1)
        y = self.self_attn(self.norm1(x_BLD) * (1 + scale1) + shift1, rope)
        x_BLD = x_BLD + y * gate1
        x_BLD = x_BLD + self.cross_attn(self.norm3(x_BLD), ctx_BTMD)
        y = self.ffn(self.norm2(x_BLD) * (1 + scale2) + shift2)
        return x_BLD + y * gate2


class AudioProjection(nn.Module):
    """Per latent frame: its video frames' audio windows → `context_tokens` tokens of width D.

    A chunk's first latent frame stands for one video frame (its whole 5-frame window);
    each later one for `frames_per_latent` frames, whose windows are trimmed so that the
    group reads its audio once: the group's first frame keeps the window's past and centre,
    the middle frames their centre, the last its centre and future.
    """

    def __init__(self, cfg: WanDiTConfig) -> None:
        super().__init__()
        w, r = cfg.audio_window, cfg.frames_per_latent
        per_frame = cfg.audio_layers * cfg.audio_dim
        self.window = w
        self.r = r
        self.tokens = cfg.context_tokens
        self.proj1 = nn.Linear(w * per_frame, cfg.audio_hidden)
        self.proj1_vf = nn.Linear((w + r - 1) * per_frame, cfg.audio_hidden)
        self.proj2 = nn.Linear(cfg.audio_hidden, cfg.audio_hidden)
        self.proj3 = nn.Linear(cfg.audio_hidden, cfg.context_tokens * cfg.dim)
        self.norm = nn.LayerNorm(cfg.dim)

    def group_windows(self, audio_BFWSA: Tensor) -> tuple[Tensor, Tensor]:
        """(B, 1+r*k, W, S, A) → the first frame's window (B, 1, W·S·A) and each later
        latent frame's trimmed windows (B, k, (W+r-1)·S·A)."""
        B = audio_BFWSA.shape[0]
        mid = self.window // 2
        first = audio_BFWSA[:, :1].flatten(2)
        groups = audio_BFWSA[:, 1:].unflatten(1, (-1, self.r))  # (B, k, r, W, S, A)
        later = torch.cat(
            [
                groups[:, :, :1, : mid + 1].flatten(2, 3),
                groups[:, :, 1:-1, mid : mid + 1].flatten(2, 3),
                groups[:, :, -1:, mid:].flatten(2, 3),
            ],
            dim=2,
        )
        return first, later.reshape(B, later.shape[1], -1)

    def forward(self, audio_BFWSA: Tensor) -> Tensor:
        first, later = self.group_windows(audio_BFWSA)
        h = torch.cat([torch.relu(self.proj1(first)), torch.relu(self.proj1_vf(later))], dim=1)
        h = torch.relu(self.proj2(h))
        B, T = h.shape[:2]
        tokens = self.proj3(h).reshape(B, T, self.tokens, -1)
        return self.norm(tokens)


class Head(nn.Module):
    def __init__(self, cfg: WanDiTConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.norm = nn.LayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(d, cfg.out_dim * math.prod(cfg.patch_size))
        self.modulation = nn.Parameter(torch.randn(1, 2, d) / d**0.5)

    def forward(self, x_BLD: Tensor, t_BD: Tensor) -> Tensor:
        shift, scale = (self.modulation + t_BD[:, None, :]).chunk(2, dim=1)
        return self.head(self.norm(x_BLD) * (1 + scale) + shift)


class WanAudioDiT(nn.Module):
    def __init__(self, cfg: WanDiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(
            cfg.in_dim, d, kernel_size=cfg.patch_size, stride=cfg.patch_size
        )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.blocks = nn.ModuleList([AudioBlock(cfg) for _ in range(cfg.num_layers)])
        self.head = Head(cfg)
        self.audio_proj = AudioProjection(cfg)
        self._rope: dict[tuple, tuple[Tensor, Tensor]] = {}

    def audio_blocks(self) -> list[AudioBlock]:
        return [cast(AudioBlock, block) for block in self.blocks]

    def rope(self, grid: tuple[int, int, int], device: torch.device) -> tuple[Tensor, Tensor]:
        """cos/sin (L, H/2) for a (T, h, w) token grid; built once per shape and kept."""
        key = (grid, device)
        if key not in self._rope:
            angles = rope_angles(grid_positions(*grid), self.cfg.head_dim).to(device)
            self._rope[key] = (angles.cos(), angles.sin())
        return self._rope[key]

    def project_audio(self, audio_BFWSA: Tensor) -> Tensor:
        """Audio tokens (B, T, M, D) of one chunk; shared by all its sampling steps."""
        dtype = self.patch_embedding.weight.dtype
        return self.audio_proj(audio_BFWSA.to(dtype))

    def forward(self, x_BCTHW: Tensor, t_B: Tensor, ctx_BTMD: Tensor, ref_BCTHW: Tensor) -> Tensor:
        """The flow (velocity) prediction for noisy latents `x` at timestep `t` (0..1000)."""
        dtype = self.patch_embedding.weight.dtype
        tokens = self.patch_embedding(torch.cat([x_BCTHW, ref_BCTHW], dim=1).to(dtype))
        T, h, w = tokens.shape[2:]
        grid = (T, h, w)
        x_BLD = tokens.flatten(2).transpose(1, 2)
        # the release rounds the timestep to the weights' dtype before its sinusoid
        t_BD = self.time_embedding(sinusoid(t_B.to(dtype), self.cfg.freq_dim).to(dtype))
        mod_B6D = self.time_projection(t_BD).unflatten(1, (6, self.cfg.dim))
        rope = self.rope(grid, x_BLD.device)
        for block in self.audio_blocks():
            x_BLD = block(x_BLD, ctx_BTMD, mod_B6D, rope)
        return self.unpatchify(self.head(x_BLD, t_BD), grid)

    def unpatchify(self, x_BLK: Tensor, grid: tuple[int, int, int]) -> Tensor:
        T, h, w = grid
        pt, ph, pw = self.cfg.patch_size
        x = x_BLK.reshape(x_BLK.shape[0], T, h, w, pt, ph, pw, self.cfg.out_dim)
        return x.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(
            x_BLK.shape[0], self.cfg.out_dim, T * pt, h * ph, w * pw
        )
