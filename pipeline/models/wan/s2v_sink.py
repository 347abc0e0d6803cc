"""The sink's tokens and where every token of LiveAvatar's S2V transformer sits for RoPE.

The sink is the reference latent frame and FramePack's motion tokens: the newest motion
latent frame at full resolution, the two before it 2x compressed (time and space), the
sixteen before those 4x. RoPE positions: a block's tokens at their absolute latent frame;
the reference at frame 30 (slid along as the stream goes on, `S2VTransformer.sink_shift`);
FramePack's tokens at fixed negative frames with compressed grids sampled the authors' way
(numpy's linspace, truncated). The angles' cos/sin are rounded to fp16, as the authors'
complex32 tables round them.

Legend: B batch, C latent channels, T latent frames, H/W latent height/width, L tokens,
K head dim.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from pipeline.models.layers import rope_axis_dims

Rope = tuple[Tensor, Tensor]  # cos, sin (L, K/2), fp32 holding fp16 values


def rope_fp16(positions_L3: Tensor, head_dim: int, theta: float = 10000.0) -> Rope:
    """cos/sin (L, K/2) for float (t, h, w) positions, angles in fp64, rounded to fp16 as the
    authors' complex32 tables round them (`rope_precompute`), then held in fp32."""
    parts = []
    for axis, dim in enumerate(rope_axis_dims(head_dim)):
        freqs = 1.0 / torch.pow(
            theta, torch.arange(0, dim, 2, dtype=torch.float64, device=positions_L3.device) / dim
        )
        parts.append(positions_L3[:, axis, None].double() * freqs[None, :])
    angles = torch.cat(parts, dim=-1)
    return angles.cos().half().float(), angles.sin().half().float()


def block_positions(frame0: int, frames: int, h: int, w: int, device: torch.device) -> Tensor:
    """(frames*h*w, 3) positions of a block's tokens from absolute latent frame `frame0`."""
    tt, hh, ww = torch.meshgrid(
        torch.arange(frames, device=device, dtype=torch.float64) + frame0,
        torch.arange(h, device=device, dtype=torch.float64),
        torch.arange(w, device=device, dtype=torch.float64),
        indexing="ij",
    )
    return torch.stack([tt, hh, ww], dim=-1).reshape(-1, 3)


def _span(start: float, stop: float, num: int) -> list[int]:
    # numpy's linspace then truncation, as the authors sample compressed grids; torch's
    # linspace rounds differently in the last place, which can move a truncated value
    return np.linspace(start, stop, num).astype(int).tolist()


def grid(ts: list[int], hs: list[int], ws: list[int]) -> Tensor:
    t, h, w = torch.meshgrid(
        torch.tensor(ts, dtype=torch.float64),
        torch.tensor(hs, dtype=torch.float64),
        torch.tensor(ws, dtype=torch.float64),
        indexing="ij",
    )
    return torch.stack([t, h, w], dim=-1).reshape(-1, 3)


def motion_positions(buckets: tuple[int, int, int], h: int, w: int) -> Tensor:
    """Positions of FramePack's tokens (nearest bucket first), fixed for the whole stream:
    bucket k of n frames compressed c-fold starts at time -(n_0+..+n_k), spans n/c token
    frames, and samples the h x w grid at h/c x w/c points."""
    out, end = [], 0
    for n, c in zip(buckets, (1, 2, 4), strict=True):
        end += n
        ts = [-t for t in _span(end, end - n + 1, max(n // c, 1))]
        out.append(grid(ts, _span(0, h - 1, h // c), _span(0, w - 1, w // c)))
    return torch.cat(out)


class FramePack(nn.Module):
    """The motion latents as tokens: the newest frame at full resolution, the two before it
    2x compressed (in time and space), the sixteen before those 4x."""

    def __init__(self, buckets: tuple[int, int, int], c: int, d: int) -> None:
        super().__init__()
        self.buckets = buckets
        self.proj = nn.Conv3d(c, d, kernel_size=(1, 2, 2), stride=(1, 2, 2))
        self.proj_2x = nn.Conv3d(c, d, kernel_size=(2, 4, 4), stride=(2, 4, 4))
        self.proj_4x = nn.Conv3d(c, d, kernel_size=(4, 8, 8), stride=(4, 8, 8))

    def forward(self, motion_BCTHW: Tensor) -> Tensor:
        n = sum(self.buckets)
        B, C, T, H, W = motion_BCTHW.shape
        padded = motion_BCTHW.new_zeros(B, C, n, H, W)  # too few frames: zeros before them
        keep = min(n, T)
        if keep:
            padded[:, :, n - keep :] = motion_BCTHW[:, :, T - keep :]
        far, mid, near = padded.split(list(self.buckets)[::-1], dim=2)
        return torch.cat(
            [
                self.proj(near).flatten(2).transpose(1, 2),
                self.proj_2x(mid).flatten(2).transpose(1, 2),
                self.proj_4x(far).flatten(2).transpose(1, 2),
            ],
            dim=1,
        )
