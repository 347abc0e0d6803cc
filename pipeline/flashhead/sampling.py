"""FlashHead's sampler: the distilled model's timesteps, its steps over a batch of chunks,
and which audio features each of a chunk's frames reads.

Legend: B streams in a batch, C latent channels, T latent frames, h, w latent rows and
columns, M audio tokens, D their width.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pipeline.flashhead.dit import WanAudioDiT


def sampling_timesteps(steps: int, shift: float, device: torch.device) -> list[Tensor]:
    """The distilled sampler's timesteps (0..1000, then 0), shifted toward the noisy end:
    t' = shift·t / (1 + (shift − 1)·t) on t in [0, 1]."""
    if steps == 4:
        ts = [1000.0, 750.0, 500.0, 250.0]
    elif steps == 2:
        ts = [1000.0, 500.0]
    else:
        ts = [float(t) for t in np.linspace(1000, 1, steps, dtype=np.float32)]
    out = []
    for t in [*ts, 0.0]:
        u = torch.tensor([t], device=device) / 1000
        out.append(shift * u / (1 + (shift - 1) * u) * 1000)
    return out


def sample_chunks(
    dit: WanAudioDiT,
    noise_BCTHW: Tensor,
    motion_BCTHW: Tensor,
    ref_BCTHW: Tensor,
    ctx_BTMD: Tensor,
    timesteps: list[Tensor],
    generators: list[torch.Generator],
) -> Tensor:
    """Chunks' latents from their noise, one per stream of a batch, each stream's fresh
    noise from its own generator (so a stream draws the same numbers alone or batched):
    the hot path (no host syncs)."""
    x = noise_BCTHW
    m = motion_BCTHW.shape[2]
    for i in range(len(timesteps) - 1):
        x[:, :, :m] = motion_BCTHW
        flow = dit(x, timesteps[i], ctx_BTMD, ref_BCTHW)
        t_now = (timesteps[i] / 1000).to(x.dtype)
        t_next = (timesteps[i + 1] / 1000).to(x.dtype)
        clean = x - flow * t_now
        fresh = torch.stack([draw(clean.shape[1:], x, g) for g in generators])
        x = (1 - t_next) * clean + t_next * fresh
    x[:, :, :m] = motion_BCTHW
    return x


def draw(shape: torch.Size, like: Tensor, generator: torch.Generator) -> Tensor:
    return torch.randn(shape, dtype=like.dtype, device=like.device, generator=generator)


def window_indices(frames: int, end: int) -> Tensor:
    """(frames, 5) feature rows: each of the last `frames` frames before `end` with its
    neighbours ±2, clamped to the window [0, end)."""
    centre = torch.arange(end - frames, end)[:, None] + torch.arange(-2, 3)[None, :]
    return centre.clamp(0, end - 1)
