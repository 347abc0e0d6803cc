"""The four models of a config, built from it with a deterministic seeded init.

One home for "which class, which arguments, which seed": the engine, training, placement's
weight count and the tests all build through here.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.config import FacecastConfig
from pipeline.diffusion.a2v_dit import A2VDiT
from pipeline.diffusion.audio_encoder import AudioEncoder
from pipeline.diffusion.sr_dit import SRDiT
from pipeline.diffusion.vae import VAE
from pipeline.module import DTYPES, build_seeded

MODEL_NAMES = ("vae", "audio", "a2v", "sr")
SEED_OFFSETS = {"vae": 1, "audio": 2, "a2v": 3, "sr": 4}  # added to runtime.init_seed


def build_models(
    cfg: FacecastConfig,
    device: torch.device | str = "cpu",
    only: tuple[str, ...] = MODEL_NAMES,
) -> dict[str, nn.Module]:
    """The models of a config, randomly initialised from `runtime.init_seed`."""
    seed = cfg.runtime.init_seed
    a, r = cfg.runtime.attention, cfg.diffusion.vae.temporal_ratio
    C = cfg.diffusion.vae.latent_channels
    factories = {
        "vae": lambda: VAE(cfg.diffusion.vae),
        "audio": lambda: AudioEncoder(cfg.diffusion.audio),
        "a2v": lambda: A2VDiT(cfg.diffusion.a2v, C, cfg.diffusion.audio.out_dim, r, a),
        "sr": lambda: SRDiT(cfg.diffusion.sr, C, cfg.diffusion.a2v.downscale, a),
    }
    return {name: build_seeded(factories[name], seed + SEED_OFFSETS[name], device) for name in only}


def module_dtype(cfg: FacecastConfig, name: str) -> torch.dtype:
    """The audio front end (STFT, mel) stays fp32; the rest runs in the config's dtype."""
    return torch.float32 if name == "audio" else DTYPES[cfg.runtime.dtype]
