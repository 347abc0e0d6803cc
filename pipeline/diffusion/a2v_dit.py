"""Audio-to-video DiT: predicts the flow-matching velocity of a chunk of low-res latents.

Inputs per chunk: noisy latents, known latents with a per-frame mask (the boundary frames
of the previous N chunk, or the two anchors of an I chunk), per-video-frame audio features,
the reference latents (rich reference tokens, attended jointly), and the timestep.

Legend: B batch, C latent channels, T latent frames, h/w latent grid, L tokens, D model dim,
A audio feature dim, r video frames per latent frame.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.diffusion.config import A2VConfig
from pipeline.models.layers import (
    BlockStack,
    DiTBlock,
    FinalLayer,
    gelu_mlp,
    grid_positions,
    rope_angles,
    silu_linear,
    timestep_embedding,
)


class A2VDiT(nn.Module):
    def __init__(
        self,
        cfg: A2VConfig,
        latent_channels: int,
        audio_dim: int,
        temporal_ratio: int,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.latent_channels = latent_channels
        D, (_, ph, pw) = cfg.dim, cfg.patch
        self.patch = (1, ph, pw)
        # noisy latents + known latents + known mask, patchified together
        self.embed = nn.Conv3d(
            2 * latent_channels + 1, D, kernel_size=self.patch, stride=self.patch
        )
        self.ref_embed = nn.Conv3d(latent_channels, D, kernel_size=self.patch, stride=self.patch)
        self.ref_type = nn.Parameter(torch.zeros(D))
        self.time_mlp = gelu_mlp(256, D)
        self.time_mod = silu_linear(D, 6 * D)
        # the r audio feature vectors of a latent frame's video frames, concatenated
        self.audio_mlp = gelu_mlp(temporal_ratio * audio_dim, D)
        self.transformer = BlockStack(
            [DiTBlock(D, cfg.heads, cfg.mlp_ratio, attention, cond_dim=D) for _ in range(cfg.depth)]
        )
        self.final = FinalLayer(D, ph * pw * latent_channels)
        self._rope_cache: dict = {}

    def forward(
        self,
        x_BCThw: Tensor,
        t_B: Tensor,
        known_BCThw: Tensor,
        mask_BT: Tensor,
        audio_BTrA: Tensor,
        ref_BC1hw: Tensor,
    ) -> Tensor:
        B, C, T, h, w = x_BCThw.shape
        _, ph, pw = self.patch
        gh, gw = h // ph, w // pw
        mask_B1Thw = mask_BT[:, None, :, None, None].to(x_BCThw.dtype).expand(B, 1, T, h, w)
        inp = torch.cat([x_BCThw, known_BCThw * mask_B1Thw, mask_B1Thw], dim=1)
        x_BLD = self.embed(inp).flatten(2).transpose(1, 2)
        ref_BLD = self.ref_embed(ref_BC1hw).flatten(2).transpose(1, 2) + self.ref_type
        n_ref = ref_BLD.shape[1]
        seq = torch.cat([ref_BLD, x_BLD], dim=1)

        emb_BD = self.time_mlp(timestep_embedding(t_B, 256).to(seq.dtype))
        mod_B6D = self.time_mod(emb_BD).unflatten(1, (6, -1))
        audio_BTD = self.audio_mlp(audio_BTrA.reshape(B, T, -1))
        # each token gets its own frame's audio; reference tokens get none
        cond = torch.cat(
            [
                audio_BTD.new_zeros(B, n_ref, audio_BTD.shape[-1]),
                audio_BTD.repeat_interleave(gh * gw, dim=1),
            ],
            dim=1,
        )
        rope = self._rope(T, gh, gw, seq.device)
        seq = self.transformer(seq, mod_B6D, rope, None, cond)
        out_BLP = self.final(seq[:, n_ref:], emb_BD)
        out = out_BLP.view(B, T, gh, gw, C, ph, pw).permute(0, 4, 1, 2, 5, 3, 6)
        return out.reshape(B, C, T, h, w)

    def _rope(self, T: int, gh: int, gw: int, device) -> tuple[Tensor, Tensor]:
        key = (T, gh, gw, device)
        if key not in self._rope_cache:
            # the reference frame sits one step before the chunk's first frame
            pos = torch.cat([grid_positions(1, gh, gw, t_offset=-1), grid_positions(T, gh, gw)])
            angles = rope_angles(pos, self.cfg.dim // self.cfg.heads).to(device)
            self._rope_cache[key] = (angles.cos(), angles.sin())
        return self._rope_cache[key]
