"""Model families: which engine runs a config, and what start-up may do to it.

A family is the article's Module → Stage → Pipeline set for one kind of model: its modules
with their checkpoint loaders, its stages, its schedule, all behind one engine that speaks
the streaming seam (`pipeline.stream.StreamingEngine`). Everything around an engine is
shared and written once: start-up (`pipeline.startup`), warm-up (`pipeline.warmup`),
compile, FP8 (`pipeline.precision`), the stream loop, playout, render, serve, bench.

A config names its family with `runtime.stack`. The project's own stacks are picked by
`--config`; the real open models, whose weights users download, by `--model NAME`
(`REAL_MODELS`: each is a preset in `configs/` of a real-model family).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.config import FacecastConfig
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class Family:
    stack: str  # the `runtime.stack` that selects it
    summary: str
    load: Callable  # (cfg, device: str, placement) → engine
    compiles: bool  # --compile applies
    offloads: bool  # --offload / memory caps through the placement plan apply
    fp8: bool  # --precision fp8 applies
    picks_sdpa: bool  # its attention shapes are timed per SDPA backend at start-up
    prompts: bool = False  # its streams read a text prompt (`--prompt`, an offer's "prompt")


def _diffusion(cfg, device, placement):
    from pipeline.engine import Engine

    return Engine.load(cfg, device, placement)


def _photo(cfg, device, placement):
    from pipeline.photo.engine import PhotoEngine

    return PhotoEngine.load(cfg, device)


def _flashhead(cfg, device, placement):
    from pipeline.flashhead.engine import FlashHeadEngine

    return FlashHeadEngine.load(cfg, device)


def _liveavatar(cfg, device, placement):
    from pipeline.liveavatar.engine import LiveAvatarEngine

    return LiveAvatarEngine.load(cfg, device)


FAMILIES = (
    Family(
        "diffusion",
        "the project's A2V + SR DiTs and causal VAE",
        _diffusion,
        compiles=True,
        offloads=True,
        fp8=True,
        picks_sdpa=True,
    ),
    Family(
        "photo",
        "the photo stack: the user's photo, warped",
        _photo,
        compiles=False,
        offloads=False,
        fp8=False,
        picks_sdpa=False,
    ),
    Family(
        "flashhead",
        "SoulX-FlashHead from its published checkpoint",
        _flashhead,
        compiles=True,
        offloads=False,
        fp8=True,
        picks_sdpa=False,
    ),
    Family(
        "liveavatar",
        "LiveAvatar (Wan2.2-S2V-14B + its LoRA) from its published checkpoint",
        _liveavatar,
        compiles=True,
        offloads=False,
        fp8=True,
        picks_sdpa=False,
        prompts=True,
    ),
)


@dataclass(frozen=True)
class RealModel:
    """A real open model users download: its preset in `configs/` (same name), the config
    section its files go in, and the flags it cannot start without."""

    name: str
    section: str
    needs: tuple[str, ...]  # of "weights", "wav2vec", "lora"
    download: str  # what --weights is, for the one-line error


# --model NAME → the preset that runs it (a real model: its weights are the user's)
_FLASHHEAD = "a Soul-AILab/SoulX-FlashHead-1_3B folder, and --wav2vec facebook/wav2vec2-base-960h"
REAL_MODEL_TABLE = (
    RealModel("flashhead-pro", "flashhead", ("weights", "wav2vec"), _FLASHHEAD),
    RealModel("flashhead-lite", "flashhead", ("weights", "wav2vec"), _FLASHHEAD),
    RealModel(
        "liveavatar",
        "liveavatar",
        ("weights", "lora"),
        "a Wan-AI/Wan2.2-S2V-14B folder, and --lora Quark-Vision/Live-Avatar's",
    ),
)
REAL_MODELS = tuple(m.name for m in REAL_MODEL_TABLE)


def real_model(name: str) -> RealModel:
    for model in REAL_MODEL_TABLE:
        if model.name == name:
            return model
    raise ConfigError(f"model {name!r} is not one of {', '.join(REAL_MODELS)}")


def family_of(cfg: FacecastConfig) -> Family:
    for family in FAMILIES:
        if family.stack == cfg.runtime.stack:
            return family
    raise ConfigError(f"config {cfg.name!r}: no model family runs stack {cfg.runtime.stack!r}")
