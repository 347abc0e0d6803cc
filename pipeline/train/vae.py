"""VAE stage: reconstruction + a small KL, with extra weight where the face moves.

The weight map is 1 + `motion_weight` where a frame differs from its neutral reference
(open mouth, closed eyes, a turned head), so the few pixels that carry lip sync are not
drowned by the static background. The decoder stage can add a *contrast* term: the same
L1 on log light (Weber contrast), so an open mouth on a dark face, whose inner mouth is only
a few grey levels darker than its lips, costs as much to blur as on a light face.

When the A2V grid is downscaled, a quarter of the batches are at half resolution, because
the engine then also encodes the reference at the A2V grid's scale.

After training, `normalize_latents` rescales the latent channels to unit RMS, folding the
scale into the encoder's last conv and the decoder's first conv (exact: a per-channel
scale commutes with the decoder's zero padding), so flow matching sees unit-scale data.

Legend: B batch, C channels, T frames, H/W pixels, S segments, F frames per segment.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.diffusion.vae import VAE


def to_unit(frames_uint8: Tensor) -> Tensor:
    """uint8 (..., H, W, 3) → float in [-1, 1], channels first: (..., 3, H, W)."""
    return frames_uint8.movedim(-1, -3).float() / 127.5 - 1.0


def sample_clips(pool_frames: Tensor, refs: Tensor, batch: int, frames: int, gen) -> tuple:
    """Random windows of `frames` frames (starting on even frames) and their references:
    (B, 3, T, H, W) and (B, 3, H, W), both in [-1, 1]."""
    S, Fn = pool_frames.shape[:2]
    seg = torch.randint(0, S, (batch,), generator=gen)
    start = torch.randint(0, (Fn - frames) // 2 + 1, (batch,), generator=gen) * 2
    idx = start[:, None] + torch.arange(frames)[None]
    x = pool_frames[seg[:, None].to(pool_frames.device), idx.to(pool_frames.device)]
    x = to_unit(x).transpose(1, 2).contiguous()  # (B, T, 3, H, W) → (B, 3, T, H, W)
    return x, to_unit(refs[seg.to(refs.device)])


CONTRAST_FLOOR = 0.05  # light (0..1) below which differences stop counting as contrast


def log_light(x: Tensor) -> Tensor:
    """[-1, 1] pixels → log of light in [0, 1], floored: equal steps are equal contrasts."""
    return torch.log((x + 1.0).mul(0.5).clamp_min(0.0) + CONTRAST_FLOOR)


def vae_loss(
    vae: VAE,
    x_B3THW: Tensor,
    ref_B3HW: Tensor,
    kl_weight: float,
    motion_weight: float,
    contrast_weight: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    mean, logvar = vae.encoder(x_B3THW)
    logvar = logvar.clamp(-12.0, 6.0)
    z = mean + torch.randn_like(mean) * (0.5 * logvar).exp()
    rec, _ = vae.decoder(z)
    diff = (x_B3THW - ref_B3HW[:, :, None]).abs().mean(dim=1, keepdim=True)
    w = 1.0 + motion_weight * (diff * 4.0).clamp(0, 1)
    rec = rec.float()
    l1 = (w * (rec - x_B3THW).abs()).mean() / w.mean()
    kl = 0.5 * (mean.float().pow(2) + logvar.float().exp() - 1.0 - logvar.float()).mean()
    logs = {"l1": l1.detach(), "kl": kl.detach()}
    loss = l1 + kl_weight * kl
    if contrast_weight:
        contrast = (w * (log_light(rec) - log_light(x_B3THW)).abs()).mean() / w.mean()
        loss = loss + contrast_weight * contrast
        logs["contrast"] = contrast.detach()
    return loss, logs


def half_res(x_B3THW: Tensor, ref_B3HW: Tensor) -> tuple[Tensor, Tensor]:
    B, C, T, H, W = x_B3THW.shape
    x = F.interpolate(
        x_B3THW.transpose(1, 2).reshape(B * T, C, H, W), scale_factor=0.5, mode="area"
    )
    x = x.view(B, T, C, H // 2, W // 2).transpose(1, 2)
    return x, F.interpolate(ref_B3HW, scale_factor=0.5, mode="area")


@torch.no_grad()
def normalize_latents(vae: VAE, x_B3THW: Tensor) -> Tensor:
    """Rescale latent channels to unit RMS on this sample; returns the scales (C,)."""
    mean, _ = vae.encoder(x_B3THW)
    scale = mean.float().pow(2).mean(dim=(0, 2, 3, 4)).sqrt().clamp_min(1e-4)  # (C,)
    C = scale.numel()
    conv_out = vae.encoder.conv_out
    assert conv_out.bias is not None, "the encoder's last conv has a bias"
    conv_out.weight[:C] /= scale[:, None, None, None]
    conv_out.bias[:C] /= scale
    conv_out.bias[C:] -= 2.0 * scale.log()  # the variance scales with the mean
    vae.decoder.conv_in.conv.weight.mul_(scale[None, :, None, None, None])
    return scale


@torch.no_grad()
def encode_frames(vae: VAE, frames_uint8: Tensor, downscale: int, batch: int = 8) -> tuple:
    """Latent means of every segment at full res and at 1/downscale res, the way the engine
    encodes its reference: (S, C, F/r, h, w) twice."""
    full, low = [], []
    for i in range(0, frames_uint8.shape[0], batch):
        x = to_unit(frames_uint8[i : i + batch]).transpose(1, 2).contiguous()
        full.append(vae.encoder(x)[0].float())
        if downscale > 1:
            B, C, T, H, W = x.shape
            xs = F.interpolate(
                x.transpose(1, 2).reshape(B * T, C, H, W), scale_factor=1 / downscale, mode="area"
            )
            x = xs.view(B, T, C, H // downscale, W // downscale).transpose(1, 2)
        low.append(vae.encoder(x)[0].float())
    return torch.cat(full), torch.cat(low)


@torch.no_grad()
def encode_references(vae: VAE, refs_uint8: Tensor, downscale: int, batch: int = 64) -> tuple:
    """(S, C, 1, h, w) reference latents at both grids, as `InitStage` makes them."""
    full, low = [], []
    for i in range(0, refs_uint8.shape[0], batch):
        x = to_unit(refs_uint8[i : i + batch])
        full.append(vae.encode_image(x).float())
        xs = F.interpolate(x, scale_factor=1 / downscale, mode="area") if downscale > 1 else x
        low.append(vae.encode_image(xs).float())
    return torch.cat(full), torch.cat(low)
