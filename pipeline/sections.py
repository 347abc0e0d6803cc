"""Config sections every family shares, and the helpers a family's own section uses.

A config (`pipeline.config.FacecastConfig`) is made of sections, one dataclass each. The
video, schedule and runtime sections are everybody's; the project's diffusion stack reads
the VAE, audio, A2V, SR and sampler sections here; each real-model family keeps its own
section in its folder (`pipeline/flashhead/config.py`, ...). A section checks its own
values (`validate`); rules across sections belong to the family (`pipeline.families`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.clock import FPS
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig

ATTENTION_BACKENDS = ("sdpa", "flex", "facecast")
DTYPES = ("float32", "bfloat16", "float16")


def check(ok: bool, key: str, rule: str) -> None:
    """A config rule: `ConfigError` naming the key and what is allowed when it fails."""
    if not ok:
        raise ConfigError(f"bad config value for {key}: {rule}")


@dataclass
class VideoConfig:
    width: int = 128
    height: int = 128
    fps: int = FPS

    def validate(self) -> None:
        check(
            self.fps == FPS, "video.fps", "must be 25 (the engine's audio/video clock assumes it)"
        )
        check(16 <= self.width <= 4096, "video.width", "must be in [16, 4096]")
        check(16 <= self.height <= 4096, "video.height", "must be in [16, 4096]")


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
        check(levels >= 1, "vae.channels", "needs at least one level")
        check(
            self.spatial_ratio == 2**levels,
            "vae.spatial_ratio",
            f"must equal 2**len(vae.channels) = {2**levels} (one 2x resample per level)",
        )
        check(self.temporal_ratio in (1, 2, 4), "vae.temporal_ratio", "must be 1, 2 or 4")
        check(self.latent_channels >= 1, "vae.latent_channels", "must be >= 1")


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
        check(self.dim % self.heads == 0, "audio.dim", "must be divisible by audio.heads")
        check(self.context_frames >= 0, "audio.context_frames", "must be >= 0")
        check(self.lookahead_frames >= 0, "audio.lookahead_frames", "must be >= 0")


@dataclass
class A2VConfig:
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    patch: list[int] = field(default_factory=lambda: [1, 1, 1])  # (t, h, w)
    downscale: int = 2  # the A2V grid is the full-res latent grid divided by this

    def validate(self) -> None:
        check(self.dim % self.heads == 0, "a2v.dim", "must be divisible by a2v.heads")
        check((self.dim // self.heads) % 2 == 0, "a2v.heads", "head dim must be even (RoPE)")
        check(
            len(self.patch) == 3 and self.patch[0] == 1,
            "a2v.patch",
            "must be [1, ph, pw] (no temporal patching: chunks are whole latent frames)",
        )
        check(self.downscale in (1, 2, 4), "a2v.downscale", "must be 1, 2 or 4")


@dataclass
class SRConfig:
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    window: int = 1  # each frame attends frames within ±window, plus the reference frame
    noise: float = 0.1  # noise mixed into the one-step input

    def validate(self) -> None:
        check(self.dim % self.heads == 0, "sr.dim", "must be divisible by sr.heads")
        check((self.dim // self.heads) % 2 == 0, "sr.heads", "head dim must be even (RoPE)")
        check(self.window >= 0, "sr.window", "must be >= 0")


@dataclass
class ScheduleConfig:
    chunk_latents: int = 6  # latent frames per N chunk
    first_chunk_latents: int = 4  # shorter first chunk: faster first frame
    seam_latents: int = 1  # w: each I chunk regenerates w frames either side of a seam
    boundary_latents: int = 2  # b: previous N chunk frames an N chunk is conditioned on

    def validate(self) -> None:
        w = self.seam_latents
        check(w >= 0, "schedule.seam_latents", "must be >= 0")
        check(self.boundary_latents >= 0, "schedule.boundary_latents", "must be >= 0")
        for key in ("chunk_latents", "first_chunk_latents"):
            check(
                getattr(self, key) >= 2 * w + 1,
                f"schedule.{key}",
                f"must be >= 2*seam_latents+1 = {2 * w + 1} so each chunk keeps a body",
            )


@dataclass
class SamplerConfig:
    steps: int = 4
    shift: float = 3.0

    def validate(self) -> None:
        check(1 <= self.steps <= 1000, "sampler.steps", "must be in [1, 1000]")
        check(self.shift > 0, "sampler.shift", "must be > 0")


@dataclass
class RuntimeConfig:
    stack: str = "diffusion"  # the model family (`pipeline.families`); checked by the config
    dtype: str = "float32"
    attention: str = "sdpa"
    weights: str | None = None  # safetensors path, or "package:NAME" for shipped weights
    init_seed: int = 0  # used when weights is None: deterministic random init

    def validate(self) -> None:
        check(self.dtype in DTYPES, "runtime.dtype", f"must be one of {DTYPES}")
        check(
            self.attention in ATTENTION_BACKENDS,
            "runtime.attention",
            f"must be one of {ATTENTION_BACKENDS}",
        )


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
    s = cfg.vae.spatial_ratio
    full_h = _round_up(math.ceil(cfg.video.height / s), cfg.vae.grid_multiple_h)
    full_w = _round_up(math.ceil(cfg.video.width / s), cfg.vae.grid_multiple_w)
    d = cfg.a2v.downscale
    return LatentGrid(full_h, full_w, full_h // d, full_w // d, full_h * s, full_w * s)


def check_latent_grid(cfg: FacecastConfig) -> None:
    """The diffusion stack's rule across sections: the A2V grid divides the VAE's."""
    grid = latent_grid(cfg)
    check(
        grid.full_h % cfg.a2v.downscale == 0 and grid.full_w % cfg.a2v.downscale == 0,
        "a2v.downscale",
        f"must divide the latent grid {grid.full_h}x{grid.full_w}",
    )
    _, ph, pw = cfg.a2v.patch
    check(
        grid.low_h % ph == 0 and grid.low_w % pw == 0,
        "a2v.patch",
        f"must divide the A2V latent grid {grid.low_h}x{grid.low_w}",
    )


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
