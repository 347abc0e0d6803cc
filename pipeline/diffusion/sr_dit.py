"""Super-resolution DiT: one step from low-res to full-res latents.

The low-res latents are upsampled (nearest), mixed with a little noise, and refined by a
transformer whose attention is windowed over frames: each frame sees frames within ±window
plus one global reference frame (the identity's full-res latents). The sequence is laid out
frame-major with the reference frame first, so that mask aligns with frames by construction.

Legend: B batch, C latent channels, T latent frames, h/w latent grid, L tokens, D model dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.diffusion.config import SRConfig
from pipeline.models.attention import FrameWindow
from pipeline.models.layers import BlockStack, DiTBlock, FinalLayer, grid_positions, rope_angles


class SRDiT(nn.Module):
    def __init__(
        self, cfg: SRConfig, latent_channels: int, upscale: int, attention: str = "sdpa"
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.upscale = upscale
        D = cfg.dim
        self.embed = nn.Linear(2 * latent_channels, D)
        self.ref_embed = nn.Linear(latent_channels, D)
        self.ref_type = nn.Parameter(torch.zeros(D))
        # one fixed step: the "timestep" modulation is a learned constant
        self.mod = nn.Parameter(torch.zeros(1, 6, D))
        self.emb = nn.Parameter(torch.zeros(1, D))
        self.transformer = BlockStack(
            [DiTBlock(D, cfg.heads, cfg.mlp_ratio, attention) for _ in range(cfg.depth)]
        )
        self.final = FinalLayer(D, latent_channels)
        self._rope_cache: dict = {}

    def forward(self, low_BCThw: Tensor, noise_BCTHW: Tensor, ref_BC1HW: Tensor) -> Tensor:
        up = F.interpolate(low_BCThw, scale_factor=(1, self.upscale, self.upscale), mode="nearest")
        B, C, T, H, W = up.shape
        x = torch.cat([up, self.cfg.noise * noise_BCTHW], dim=1)
        x_BLD = self.embed(x.flatten(2).transpose(1, 2))
        ref_BLD = self.ref_embed(ref_BC1HW.flatten(2).transpose(1, 2)) + self.ref_type
        seq = torch.cat([ref_BLD, x_BLD], dim=1)
        window = FrameWindow(tokens_per_frame=H * W, window=self.cfg.window, ref_frames=1)
        rope = self._rope(T, H, W, seq.device)
        mod = self.mod.expand(B, -1, -1)
        seq = self.transformer(seq, mod, rope, window)
        out_BLC = self.final(seq[:, H * W :], self.emb.expand(B, -1))
        residual = out_BLC.transpose(1, 2).reshape(B, C, T, H, W)
        return up + residual

    def _rope(self, T: int, H: int, W: int, device) -> tuple[Tensor, Tensor]:
        key = (T, H, W, device)
        if key not in self._rope_cache:
            pos = torch.cat([grid_positions(1, H, W, t_offset=-1), grid_positions(T, H, W)])
            angles = rope_angles(pos, self.cfg.dim // self.cfg.heads).to(device)
            self._rope_cache[key] = (angles.cos(), angles.sin())
        return self._rope_cache[key]
