"""Init stage: encode the reference identity once per session into latents at both the
full-res (SR) and low-res (A2V) grids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.config import FacecastConfig
from pipeline.diffusion.config import latent_grid
from pipeline.diffusion.vae import VAE
from pipeline.errors import MediaError
from pipeline.module import Module


@dataclass
class ReferenceCond:
    full_BC1HW: Tensor  # reference latents on the full-res grid (SR's global frame)
    low_BC1hw: Tensor  # on the A2V grid (A2V's reference tokens)


def fit_reference(image: np.ndarray, width: int, height: int, pad_w: int, pad_h: int) -> Tensor:
    """uint8 (H, W, 3) → float (1, 3, pad_h, pad_w) in [-1, 1]: scale to cover the video
    size, centre-crop, then pad right/bottom by edge replication up to the latent grid."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise MediaError(f"reference must be an RGB uint8 image, got {image.dtype} {image.shape}")
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 127.5 - 1.0
    h, w = image.shape[:2]
    s = max(width / w, height / h)
    nh, nw = max(height, round(h * s)), max(width, round(w * s))
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
    top, left = (nh - height) // 2, (nw - width) // 2
    x = x[:, :, top : top + height, left : left + width]
    return F.pad(x, (0, pad_w - width, 0, pad_h - height), mode="replicate")


class InitStage:
    def __init__(self, vae: Module[VAE], cfg: FacecastConfig) -> None:
        self.vae = vae
        self.cfg = cfg
        self.grid = latent_grid(cfg)

    @torch.inference_mode()
    def run(self, image: np.ndarray) -> ReferenceCond:
        g, v = self.grid, self.cfg.video
        x = fit_reference(image, v.width, v.height, g.pixel_w, g.pixel_h)
        x = x.to(self.vae.device, self.vae.dtype)
        full = self.vae.model.encode_image(x)
        d = self.cfg.diffusion.a2v.downscale
        low_px = F.interpolate(x, scale_factor=1 / d, mode="area") if d > 1 else x
        low = self.vae.model.encode_image(low_px)
        return ReferenceCond(full, low)
