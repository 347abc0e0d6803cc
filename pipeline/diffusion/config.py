"""The diffusion stack's config sections (`diffusion:` in a preset), and its rule across them.

The stack (`runtime.stack: diffusion`, `pipeline/diffusion/`) reads five sections, nested
under one key: `vae` (the causal VAE), `audio` (the audio encoder), `a2v` (the audio-to-video
DiT), `sr` (the super-resolution DiT) and `sampler` (the A2V sampler). Sizes are in pixels
(video) or latent frames (schedule); `latent_grid` is where the two meet. A preset that still
has these sections at its top level (the form before they were nested) loads with one
warning (`pipeline.config.load_config`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.sections import check

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig


@dataclass
class VAEConfig:
    latent_channels: int = 8
    spatial_ratio: int = 8  # pixels per latent cell, a power of two
    temporal_ratio: int = 1  # video frames per latent frame
    channels: list[int] = field(default_factory=lambda: [16, 32, 64])  # high-res → low-res
    res_blocks: int = 1
    # Rows/cols of the full-res latent grid are padded to multiples of these so tokens per
    # frame align with attention tiles (e.g. 720p, 16x: 80x45 → 80x48 = 30x128 tokens).
    grid_multiple_h: int = 1
    grid_multiple_w: int = 1

    def validate(self) -> None:
        levels = len(self.channels)
        check(levels >= 1, "diffusion.vae.channels", "needs at least one level")
        check(
            self.spatial_ratio == 2**levels,
            "diffusion.vae.spatial_ratio",
            f"must equal 2**len(diffusion.vae.channels) = {2**levels} (one 2x resample per level)",
        )
        check(self.temporal_ratio in (1, 2, 4), "diffusion.vae.temporal_ratio", "must be 1, 2 or 4")
        check(self.latent_channels >= 1, "diffusion.vae.latent_channels", "must be >= 1")


@dataclass
class AudioEncoderConfig:
    n_mels: int = 80
    dim: int = 64
    layers: int = 1
    heads: int = 4
    out_dim: int = 64
    context_frames: int = 8  # left audio context per chunk, in video frames
    lookahead_frames: int = 2  # right context: latency vs. lip-sync anticipation

    def validate(self) -> None:
        check(
            self.dim % self.heads == 0,
            "diffusion.audio.dim",
            "must be divisible by diffusion.audio.heads",
        )
        check(self.context_frames >= 0, "diffusion.audio.context_frames", "must be >= 0")
        check(self.lookahead_frames >= 0, "diffusion.audio.lookahead_frames", "must be >= 0")


@dataclass
class A2VConfig:
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    patch: list[int] = field(default_factory=lambda: [1, 1, 1])  # (t, h, w)
    downscale: int = 2  # the A2V grid is the full-res latent grid divided by this

    def validate(self) -> None:
        check(
            self.dim % self.heads == 0,
            "diffusion.a2v.dim",
            "must be divisible by diffusion.a2v.heads",
        )
        check(
            (self.dim // self.heads) % 2 == 0, "diffusion.a2v.heads", "head dim must be even (RoPE)"
        )
        check(
            len(self.patch) == 3 and self.patch[0] == 1,
            "diffusion.a2v.patch",
            "must be [1, ph, pw] (no temporal patching: chunks are whole latent frames)",
        )
        check(self.downscale in (1, 2, 4), "diffusion.a2v.downscale", "must be 1, 2 or 4")


@dataclass
class SRConfig:
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    window: int = 1  # each frame attends frames within ±window, plus the reference frame
    noise: float = 0.1  # noise mixed into the one-step input

    def validate(self) -> None:
        check(
            self.dim % self.heads == 0,
            "diffusion.sr.dim",
            "must be divisible by diffusion.sr.heads",
        )
        check(
            (self.dim // self.heads) % 2 == 0, "diffusion.sr.heads", "head dim must be even (RoPE)"
        )
        check(self.window >= 0, "diffusion.sr.window", "must be >= 0")


@dataclass
class SamplerConfig:
    steps: int = 4
    shift: float = 3.0

    def validate(self) -> None:
        check(1 <= self.steps <= 1000, "diffusion.sampler.steps", "must be in [1, 1000]")
        check(self.shift > 0, "diffusion.sampler.shift", "must be > 0")


@dataclass
class DiffusionConfig:
    """The project's own stack: audio encoder → A2V DiT → SR DiT → causal VAE decode."""

    vae: VAEConfig = field(default_factory=VAEConfig)
    audio: AudioEncoderConfig = field(default_factory=AudioEncoderConfig)
    a2v: A2VConfig = field(default_factory=A2VConfig)
    sr: SRConfig = field(default_factory=SRConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)

    def validate(self) -> None:
        for section in (self.vae, self.audio, self.a2v, self.sr, self.sampler):
            section.validate()


# its sections by key, as a preset nests them under `diffusion:`
SECTIONS: dict[str, type] = {
    "vae": VAEConfig,
    "audio": AudioEncoderConfig,
    "a2v": A2VConfig,
    "sr": SRConfig,
    "sampler": SamplerConfig,
}


@dataclass(frozen=True)
class LatentGrid:
    """Where pixels and latents meet: padded pixel size and both latent grids."""

    full_h: int  # full-res latent rows (padded)
    full_w: int
    low_h: int  # A2V latent rows
    low_w: int
    pixel_h: int  # padded pixel size the VAE decodes to (then cropped to the video size)
    pixel_w: int


def latent_grid(cfg: FacecastConfig) -> LatentGrid:
    s = cfg.diffusion.vae.spatial_ratio
    full_h = _round_up(math.ceil(cfg.video.height / s), cfg.diffusion.vae.grid_multiple_h)
    full_w = _round_up(math.ceil(cfg.video.width / s), cfg.diffusion.vae.grid_multiple_w)
    d = cfg.diffusion.a2v.downscale
    return LatentGrid(full_h, full_w, full_h // d, full_w // d, full_h * s, full_w * s)


def check_config(cfg: FacecastConfig) -> None:
    """The diffusion stack's rule across sections: the A2V grid divides the VAE's."""
    grid = latent_grid(cfg)
    check(
        grid.full_h % cfg.diffusion.a2v.downscale == 0
        and grid.full_w % cfg.diffusion.a2v.downscale == 0,
        "diffusion.a2v.downscale",
        f"must divide the latent grid {grid.full_h}x{grid.full_w}",
    )
    _, ph, pw = cfg.diffusion.a2v.patch
    check(
        grid.low_h % ph == 0 and grid.low_w % pw == 0,
        "diffusion.a2v.patch",
        f"must divide the A2V latent grid {grid.low_h}x{grid.low_w}",
    )


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
