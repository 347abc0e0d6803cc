"""A2V stage: multi-step flow-matching sampling of a chunk's low-res latents."""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.diffusion.a2v_dit import A2VDiT
from pipeline.diffusion.config import SamplerConfig
from pipeline.diffusion.sampler import sample_euler
from pipeline.diffusion.stages.context import ChunkContext
from pipeline.diffusion.stages.init import ReferenceCond
from pipeline.module import Module


class A2VStage:
    def __init__(self, a2v: Module[A2VDiT], sampler: SamplerConfig) -> None:
        self.a2v = a2v
        self.sampler = sampler

    @torch.inference_mode()
    def run(self, ctx: ChunkContext, ref: ReferenceCond) -> Tensor:
        model = self.a2v.model

        def velocity(x: Tensor, t_B: Tensor) -> Tensor:
            return model(x, t_B, ctx.known_BCThw, ctx.mask_BT, ctx.audio_BTrA, ref.low_BC1hw)

        return sample_euler(
            velocity,
            ctx.noise_BCThw,
            ctx.known_BCThw,
            ctx.mask_BT,
            self.sampler.steps,
            self.sampler.shift,
        )
