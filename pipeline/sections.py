"""Config sections every family shares, and the helpers a family's own section uses.

A config (`pipeline.config.FacecastConfig`) is made of sections, one dataclass each. The
video, schedule and runtime sections are everybody's; each family keeps its own section(s)
in its folder (`pipeline/diffusion/config.py`, `pipeline/flashhead/config.py`, ...). A
section checks its own values (`validate`); rules across sections belong to the family
(`pipeline.families`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.clock import FPS
from pipeline.errors import ConfigError

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
class RuntimeConfig:
    stack: str = "diffusion"  # the model family (`pipeline.families`); checked by the config
    dtype: str = "float32"
    attention: str = "sdpa"
    weights: str | None = None  # safetensors path, or "package:NAME" for shipped weights
    init_seed: int = 0  # used when weights is None: deterministic random init
    # the real models' speech encoders (wav2vec2) from CUDA graphs on a GPU: their few hundred
    # short kernels launched at once instead of one by one (`pipeline.graphs`); the same
    # numbers, checked at capture. Off until the H200 has measured what it saves
    speech_graphs: bool = False

    def validate(self) -> None:
        check(self.dtype in DTYPES, "runtime.dtype", f"must be one of {DTYPES}")
        check(
            self.attention in ATTENTION_BACKENDS,
            "runtime.attention",
            f"must be one of {ATTENTION_BACKENDS}",
        )
