"""SR stage: one step from low-res to full-res latents for each emitted segment.

The frame window needs neighbours: a segment is refined together with the last `window`
low-res frames of the previous segment, whose outputs are discarded (they were emitted).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.diffusion.sampler import chunk_generator
from pipeline.diffusion.sr_dit import SRDiT
from pipeline.diffusion.stages.init import ReferenceCond
from pipeline.module import Module
from pipeline.transfer import to_device


class SRStage:
    def __init__(self, sr: Module[SRDiT], seed: int) -> None:
        self.sr = sr
        self.seed = seed

    @torch.inference_mode()
    def run(
        self, low_BCThw: Tensor, context_frames: int, ref: ReferenceCond, segment_index: int
    ) -> Tensor:
        model = self.sr.model
        B, C, T, h, w = low_BCThw.shape
        H, W = h * model.upscale, w * model.upscale
        gen = chunk_generator(self.seed, "SR", segment_index)
        noise = to_device(torch.randn((B, C, T, H, W), generator=gen), low_BCThw.device)
        noise = noise.to(low_BCThw.dtype)
        full = model(low_BCThw, noise, ref.full_BC1HW)
        return full[:, :, context_frames:]
