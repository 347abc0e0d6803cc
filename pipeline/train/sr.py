"""SR stage: one-step regression from A2V-grid latents to full-res latents.

Inputs are the latents of the A2V-grid frames (what A2V generates), noised because at run
time they come from the sampler — with `a2v.downscale: 1` the SR is a same-grid refiner
that learns to clean the sampler's errors; targets are the latents of the full-res
frames; the reference frame is the identity's full-res latent, as in `SRStage`.

Legend: B batch, C latent channels, T latent frames, h/w A2V grid, H/W full-res grid.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.diffusion.sr_dit import SRDiT
from pipeline.train.a2v import motion_weights


def sample_pairs(
    low: Tensor, full: Tensor, ref_full: Tensor, batch: int, frames: int, gen
) -> tuple[Tensor, Tensor, Tensor]:
    S, _, Fl = low.shape[:3]
    dev = low.device
    seg = torch.randint(0, S, (batch,), generator=gen).to(dev)
    p = torch.randint(0, Fl - frames + 1, (batch,), generator=gen).to(dev)
    idx = p[:, None] + torch.arange(frames, device=dev)[None]
    pick = lambda z: z[seg[:, None], :, idx].permute(0, 2, 1, 3, 4)  # noqa: E731
    return pick(low), pick(full), ref_full[seg]


def sr_loss(
    sr: SRDiT, low: Tensor, full: Tensor, ref_full: Tensor, gen, input_noise: float = 0.05
) -> tuple[Tensor, dict[str, Tensor]]:
    """Regression loss of one batch; `gen` is a generator on the batch's device."""
    dev = low.device
    low_in = low + input_noise * torch.randn(low.shape, generator=gen, device=dev)
    noise = torch.randn(full.shape, generator=gen, device=dev)
    pred = sr(low_in, noise, ref_full).float()
    err = (pred - full).pow(2)
    wts = motion_weights(full)
    loss = (wts * err).mean() / wts.mean()
    return loss, {"mse": err.mean().detach()}
