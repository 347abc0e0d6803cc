"""Context stage: the audio of a chunk → per-video-frame features; plus the chunk's noise
and its known (boundary or anchor) latents.

Features for a chunk are computed from its own audio window plus `context_frames` of audio
before and `lookahead_frames` after, so they depend only on the audio, never on how it was
split into pushes; that makes streaming and batch renders identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.diffusion.audio_encoder import AudioEncoder
from pipeline.diffusion.config import latent_grid
from pipeline.diffusion.sampler import chunk_generator
from pipeline.module import Module
from pipeline.schedule import Chunk
from pipeline.timeline import AudioTimeline
from pipeline.transfer import to_device


@dataclass
class ChunkContext:
    chunk: Chunk
    audio_BTrA: Tensor  # one feature vector per video frame of the chunk
    noise_BCThw: Tensor
    known_BCThw: Tensor  # zeros except at known positions
    mask_BT: Tensor  # 1 at known positions


class ContextStage:
    def __init__(
        self,
        audio: Module[AudioEncoder],
        cfg: FacecastConfig,
        seed: int,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.audio = audio
        self.cfg = cfg
        self.seed = seed
        # the DiTs' dtype: the audio encoder itself stays fp32, its outputs do not
        self.dtype = dtype or audio.dtype
        self.grid = latent_grid(cfg)

    def audio_window(self, chunk: Chunk) -> tuple[int, int]:
        """Absolute sample range this chunk's features read (context and lookahead included)."""
        r, a = self.cfg.diffusion.vae.temporal_ratio, self.cfg.diffusion.audio
        first, last = chunk.start * r, chunk.end * r
        return (
            (first - a.context_frames) * MODEL_SAMPLES_PER_FRAME,
            (last + a.lookahead_frames) * MODEL_SAMPLES_PER_FRAME,
        )

    @torch.inference_mode()
    def run(self, timeline: AudioTimeline, chunk: Chunk, known: dict[int, Tensor]) -> ChunkContext:
        """`known` maps absolute latent positions to (1, C, 1, h, w) latents."""
        dev, dt = self.audio.device, self.dtype
        lo, hi = self.audio_window(chunk)
        samples = to_device(torch.from_numpy(timeline.read(lo, hi))[None], dev)
        feats = self.audio.model(samples)
        skip = self.cfg.diffusion.audio.context_frames
        n_video = chunk.length * self.cfg.diffusion.vae.temporal_ratio
        audio_BTrA = feats[:, skip : skip + n_video].to(dt)

        C, g = self.cfg.diffusion.vae.latent_channels, self.grid
        shape = (1, C, chunk.length, g.low_h, g.low_w)
        noise = torch.randn(shape, generator=chunk_generator(self.seed, chunk.kind, chunk.index))
        known_lat = torch.zeros(shape, device=dev, dtype=dt)
        mask = torch.zeros(1, chunk.length, device=dev, dtype=dt)
        for pos in chunk.known:
            known_lat[:, :, pos : pos + 1] = known[chunk.start + pos]
            mask[:, pos] = 1
        return ChunkContext(chunk, audio_BTrA, to_device(noise, dev, dt), known_lat, mask)
