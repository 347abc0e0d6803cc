"""Model families: one typed row each, and everything the rest of the code asks of one.

A family is the article's Module → Stage → Pipeline set for one kind of model: its modules
with their checkpoint loaders, its stages, its schedule, all behind one engine that speaks
the streaming seam (`pipeline.stream.StreamingEngine`) and the start-up contract
(`pipeline.family_engine.FamilyEngine`). Everything around an engine is shared and written
once: start-up (`pipeline.startup`), warm-up (`pipeline.warmup`), compile, FP8
(`pipeline.precision`), the stream loop, playout, render, serve, bench.

A config names its family with `runtime.stack`, and this module is the only place that
reads that string: every other module asks the row (`family_of(cfg)`) what the family
does — its config sections and their rules, which flags it needs, whether it takes photos,
a face box or a prompt, what start-up may do to it. Adding a family is a folder under
`pipeline/`, a row here and a preset in `configs/`. Engines and checks are named as
"module:attribute" strings, imported only when used, so that reading a config never
imports torch-heavy model code.

The project's own stacks are picked by `--config`; the real open models, whose weights
users download, by `--model NAME` (`REAL_MODELS`: each is a preset in `configs/` of a
real-model family).
"""

# mypy: disallow-untyped-defs

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.diffusion.config import check_config as check_diffusion
from pipeline.errors import ConfigError
from pipeline.flashhead.config import check_config as check_flashhead
from pipeline.liveavatar.config import check_config as check_liveavatar

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig

# the flags a real model may take, in the order messages list them
MODEL_FLAGS = ("weights", "wav2vec", "lora", "prompt")


@dataclass(frozen=True)
class Family:
    stack: str  # the `runtime.stack` that selects it
    summary: str
    engine: str  # "module:Class" of its engine, imported when a config of it starts
    # the config sections it reads beyond video, schedule and runtime (validated only when
    # it is the config's family)
    sections: tuple[str, ...]
    temporal_stride: Callable[[FacecastConfig], int]  # video frames a latent frame spans
    lookahead_frames: Callable[[FacecastConfig], int]  # audio a chunk reads past its end
    check_config: Callable[[FacecastConfig], None] | None = None  # rules across sections
    counts_latents: bool = False  # its schedule counts latent frames, not video frames
    # what start-up may do to it
    compiles: bool = False  # --compile applies
    offloads: bool = False  # --offload / memory caps through the placement plan apply
    fp8: bool = False  # --precision fp8 applies
    picks_sdpa: bool = False  # its attention shapes are timed per SDPA backend at start-up
    dits: bool = True  # `facecast bench` and `gate` measure its DiTs
    # its reference
    photos: bool = False  # it animates uploaded photos, checked once (`pipeline.photo`)
    face_box: bool = False  # a reference is checked as a photo and framed: --face-box applies
    frame: str | None = None  # "module:function" (rgb, cfg, face_box) → its framed reference
    frame_box: str | None = None  # "module:function" (shape, box, cfg) → the box in that frame
    default_reference: str = "reference.png"  # its bundled identity, under pipeline/assets/
    prompts: bool = False  # its streams read a text prompt (`--prompt`, an offer's "prompt")
    # a real model's files
    needs: tuple[str, ...] = ()  # the MODEL_FLAGS it cannot start without
    accepts: tuple[str, ...] = ()  # the MODEL_FLAGS it takes (needs included)
    download: str = ""  # what --weights is, for the one-line error
    preflight: str | None = None  # "module:function" (cfg): the cheap checks before serving
    # torch's CPU threads for an in-process engine on a GPU (None: leave them)
    gpu_torch_threads: int | None = None
    # a family added at run time (`register`): the dataclass of its own section, read from
    # the preset's key named after its stack (`FacecastConfig.section`); the families above
    # have theirs as `FacecastConfig` fields, for typed access
    section: type | None = None

    def engine_class(self) -> Any:
        """The engine class, imported now."""
        return _resolve(self.engine)

    def frame_reference(self, rgb: Any, cfg: FacecastConfig, face_box: Any = None) -> Any:
        """A checked photo framed as this family's model takes it (as it is without a
        framing of its own)."""
        return rgb if self.frame is None else _resolve(self.frame)(rgb, cfg, face_box)

    def box_in_frame(self, shape: tuple[int, ...], box: Any, cfg: FacecastConfig) -> Any:
        """Where a face box of the photo lands in `frame_reference`'s image."""
        assert self.frame_box is not None, f"{self.stack} does not frame its reference"
        return _resolve(self.frame_box)(shape, box, cfg)

    def run_preflight(self, cfg: FacecastConfig) -> None:
        """What a server checks before it listens, so a broken download or a missing model
        file is one line at start-up and not an error in the first peer's session."""
        if self.preflight is not None:
            _resolve(self.preflight)(cfg)


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


_FLASHHEAD_FILES = (
    "a Soul-AILab/SoulX-FlashHead-1_3B folder, and --wav2vec facebook/wav2vec2-base-960h"
)
_PORTRAIT = "portraits/grace_hopper.jpg"

FAMILIES: tuple[Family, ...] = (
    Family(
        "diffusion",
        "the project's A2V + SR DiTs and causal VAE",
        "pipeline.diffusion.engine:Engine",
        sections=("diffusion",),
        temporal_stride=lambda cfg: cfg.diffusion.vae.temporal_ratio,
        lookahead_frames=lambda cfg: cfg.diffusion.audio.lookahead_frames,
        check_config=check_diffusion,
        counts_latents=True,
        compiles=True,
        offloads=True,
        fp8=True,
        picks_sdpa=True,
    ),
    Family(
        "photo",
        "the photo stack: the user's photo, warped",
        "pipeline.photo.engine:PhotoEngine",
        sections=("photo",),
        temporal_stride=lambda cfg: 1,  # no VAE
        lookahead_frames=lambda cfg: cfg.photo.lookahead_frames,
        dits=False,
        photos=True,
        face_box=True,
        default_reference=_PORTRAIT,
        preflight="pipeline.faces.landmarks:preflight",
        # on a GPU it computes nothing on the CPU with torch: torch's threads would only
        # crowd the VAD's small windows (`realtime.engine_host.torch_threads_in_process`)
        gpu_torch_threads=1,
    ),
    Family(
        "flashhead",
        "SoulX-FlashHead from its published checkpoint",
        "pipeline.flashhead.engine:FlashHeadEngine",
        sections=("flashhead",),
        temporal_stride=lambda cfg: cfg.flashhead.temporal_stride,
        lookahead_frames=lambda cfg: 0,  # a chunk's last frames read audio clamped at its end
        check_config=check_flashhead,
        compiles=True,
        fp8=True,
        face_box=True,
        frame="pipeline.flashhead.framing:frame_for_model",
        frame_box="pipeline.flashhead.framing:box_for_model",
        default_reference=_PORTRAIT,
        needs=("weights", "wav2vec"),
        accepts=("weights", "wav2vec"),
        download=_FLASHHEAD_FILES,
        preflight="pipeline.flashhead.weights:preflight",
    ),
    Family(
        "liveavatar",
        "LiveAvatar (Wan2.2-S2V-14B + its LoRA) from its published checkpoint",
        "pipeline.liveavatar.engine:LiveAvatarEngine",
        sections=("liveavatar",),
        temporal_stride=lambda cfg: 4,  # the Wan 2.1 VAE
        lookahead_frames=lambda cfg: cfg.liveavatar.audio_lookahead_frames,
        check_config=check_liveavatar,
        compiles=True,
        fp8=True,
        face_box=True,
        frame="pipeline.liveavatar.framing:frame_for_model",
        frame_box="pipeline.liveavatar.framing:box_for_model",
        prompts=True,
        needs=("weights", "lora"),
        accepts=("weights", "wav2vec", "lora", "prompt"),
        download="a Wan-AI/Wan2.2-S2V-14B folder, and --lora Quark-Vision/Live-Avatar's",
        preflight="pipeline.liveavatar.weights:preflight",
    ),
)


def register(family: Family) -> None:
    """Add a family at run time (tests add throwaway ones); its stack must be new."""
    global FAMILIES
    if any(f.stack == family.stack for f in FAMILIES):
        raise ValueError(f"a family already runs stack {family.stack!r}")
    FAMILIES = (*FAMILIES, family)


def unregister(stack: str) -> None:
    global FAMILIES
    FAMILIES = tuple(f for f in FAMILIES if f.stack != stack)


def stacks() -> tuple[str, ...]:
    return tuple(f.stack for f in FAMILIES)


def family_named(stack: str) -> Family:
    for family in FAMILIES:
        if family.stack == stack:
            return family
    raise ConfigError(f"bad config value for runtime.stack: must be one of {stacks()}")


def family_of(cfg: FacecastConfig) -> Family:
    for family in FAMILIES:
        if family.stack == cfg.runtime.stack:
            return family
    raise ConfigError(f"config {cfg.name!r}: no model family runs stack {cfg.runtime.stack!r}")


@dataclass(frozen=True)
class RealModel:
    """A real open model users download: its preset in `configs/` (same name) and its
    family, whose row says which files it needs."""

    name: str
    stack: str

    @property
    def family(self) -> Family:
        return family_named(self.stack)


# --model NAME → the preset that runs it (a real model: its weights are the user's)
REAL_MODEL_TABLE = (
    RealModel("flashhead-pro", "flashhead"),
    RealModel("flashhead-lite", "flashhead"),
    RealModel("liveavatar", "liveavatar"),
)
REAL_MODELS = tuple(m.name for m in REAL_MODEL_TABLE)


def real_model(name: str) -> RealModel:
    for model in REAL_MODEL_TABLE:
        if model.name == name:
            return model
    raise ConfigError(f"model {name!r} is not one of {', '.join(REAL_MODELS)}")


def models_taking(flag: str) -> list[str]:
    """The real models whose family takes `--flag` (for messages and help)."""
    return [m.name for m in REAL_MODEL_TABLE if flag in m.family.accepts]


def check_model_flags(model: str | None, given: dict[str, str | None]) -> None:
    """--model's files are there, and no model flag came without a model that takes it;
    `given`: MODEL_FLAGS → the values on the command line."""
    if model is None:
        stray = [f"--{flag}" for flag in MODEL_FLAGS if given.get(flag)]
        if stray:
            raise ConfigError(f"{' and '.join(stray)} go with --model NAME")
        return
    real = real_model(model)
    family = real.family
    missing = [f"--{flag}" for flag in family.needs if not given.get(flag)]
    if missing:
        raise ConfigError(
            f"--model {real.name} needs {' and '.join(missing)} (--weights: "
            f"{family.download}): README, 'Run a real model'"
        )
    for flag in MODEL_FLAGS:
        if given.get(flag) is not None and flag not in family.accepts:
            takers = " or ".join(f"--model {name}" for name in models_taking(flag))
            raise ConfigError(f"--{flag} goes with {takers}, not {real.name}")


def model_flags_help() -> str:
    """--model's help, from the rows: which flags each family needs."""
    needs: dict[str, tuple[Family, list[str]]] = {}
    for m in REAL_MODEL_TABLE:
        needs.setdefault(m.stack, (m.family, []))[1].append(m.name)
    parts = [
        f"{' '.join('--' + f for f in family.needs)} ({', '.join(names)})"
        for family, names in needs.values()
    ]
    return "a real open model from its published weights (instead of --config); needs " + (
        "; ".join(parts)
    )
