"""Decode stage: streaming causal VAE decode of full-res latents into RGB uint8 frames,
cropped from the padded latent grid to the video size, handed to the host frame-major.

On a GPU the frames come back through pinned host memory from torch's caching host
allocator: a 720p step's 44 MB land in 2-3 ms, where a fresh pageable array cost 37 ms on
the H200 (every page faulted in on each step; bench/decode_bench.py). The returned array
owns its block: it goes back to the cache when the last consumer lets go of the frames."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pipeline.diffusion.vae import VAE, Cache
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
        rgb_THWC = rgb.permute(1, 2, 3, 0).contiguous()
        if rgb_THWC.device.type != "cuda":
            return rgb_THWC.numpy(), cache
        host = torch.empty(rgb_THWC.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(rgb_THWC, non_blocking=True)
        torch.cuda.current_stream(rgb_THWC.device).synchronize()
        return host.numpy(), cache
