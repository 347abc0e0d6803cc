"""Decode stage: streaming causal VAE decode of full-res latents into RGB uint8 frames,
cropped from the padded latent grid to the video size."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pipeline.models.vae import VAE, Cache
from pipeline.module import Module


class DecodeStage:
    def __init__(self, vae: Module[VAE], width: int, height: int) -> None:
        self.vae = vae
        self.width = width
        self.height = height

    @torch.inference_mode()
    def run(self, full_BCThw: Tensor, cache: Cache | None) -> tuple[np.ndarray, Cache]:
        frames_B3THW, cache = self.vae.model.decoder(full_BCThw, cache)
        x = frames_B3THW[0, :, :, : self.height, : self.width]
        rgb = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        # frame-major on the device, before the copy: `.cpu()` of the permuted view keeps
        # its strides, and every consumer then transposed 44 MB a 720p step on the host
        # (in the media loop, or the engine process's copy into shared memory)
        return rgb.permute(1, 2, 3, 0).contiguous().cpu().numpy(), cache
