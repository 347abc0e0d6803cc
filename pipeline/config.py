"""Typed configuration: dataclasses for every module and stage, loaded from YAML presets.

`load_config("tiny")` reads `configs/tiny.yaml`; a path to any YAML file works too. Unknown
keys, wrong types and out-of-range values raise `ConfigError` naming the key and what is
allowed. Sizes here are in pixels (video) or latent frames (schedule); see `latent_grid`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.clock import FPS
from pipeline.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
# The default avatar: the photo stack animates the user's own photo (a bundled public-domain
# portrait without one); `demo` is the synthetic world's stack and its identities.
DEFAULT_CONFIG = "photo"
ATTENTION_BACKENDS = ("sdpa", "flex", "facecast")
DTYPES = ("float32", "bfloat16", "float16")
STACKS = ("diffusion", "photo", "flashhead", "liveavatar")


@typing.runtime_checkable
class _Section(typing.Protocol):
    """A config section: checks its own values (`FacecastConfig.validate` calls each)."""

    def validate(self) -> None: ...


@dataclass
class VideoConfig:
    width: int = 128
    height: int = 128
    fps: int = FPS

    def validate(self) -> None:
        _check(
            self.fps == FPS, "video.fps", "must be 25 (the engine's audio/video clock assumes it)"
        )
        _check(16 <= self.width <= 4096, "video.width", "must be in [16, 4096]")
        _check(16 <= self.height <= 4096, "video.height", "must be in [16, 4096]")


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
        _check(levels >= 1, "vae.channels", "needs at least one level")
        _check(
            self.spatial_ratio == 2**levels,
            "vae.spatial_ratio",
            f"must equal 2**len(vae.channels) = {2**levels} (one 2x resample per level)",
        )
        _check(self.temporal_ratio in (1, 2, 4), "vae.temporal_ratio", "must be 1, 2 or 4")
        _check(self.latent_channels >= 1, "vae.latent_channels", "must be >= 1")


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
        _check(self.dim % self.heads == 0, "audio.dim", "must be divisible by audio.heads")
        _check(self.context_frames >= 0, "audio.context_frames", "must be >= 0")
        _check(self.lookahead_frames >= 0, "audio.lookahead_frames", "must be >= 0")


@dataclass
class A2VConfig:
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    patch: list[int] = field(default_factory=lambda: [1, 1, 1])  # (t, h, w)
    downscale: int = 2  # the A2V grid is the full-res latent grid divided by this

    def validate(self) -> None:
        _check(self.dim % self.heads == 0, "a2v.dim", "must be divisible by a2v.heads")
        _check((self.dim // self.heads) % 2 == 0, "a2v.heads", "head dim must be even (RoPE)")
        _check(
            len(self.patch) == 3 and self.patch[0] == 1,
            "a2v.patch",
            "must be [1, ph, pw] (no temporal patching: chunks are whole latent frames)",
        )
        _check(self.downscale in (1, 2, 4), "a2v.downscale", "must be 1, 2 or 4")


@dataclass
class SRConfig:
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    window: int = 1  # each frame attends frames within ±window, plus the reference frame
    noise: float = 0.1  # noise mixed into the one-step input

    def validate(self) -> None:
        _check(self.dim % self.heads == 0, "sr.dim", "must be divisible by sr.heads")
        _check((self.dim // self.heads) % 2 == 0, "sr.heads", "head dim must be even (RoPE)")
        _check(self.window >= 0, "sr.window", "must be >= 0")


@dataclass
class ScheduleConfig:
    chunk_latents: int = 6  # latent frames per N chunk
    first_chunk_latents: int = 4  # shorter first chunk: faster first frame
    seam_latents: int = 1  # w: each I chunk regenerates w frames either side of a seam
    boundary_latents: int = 2  # b: previous N chunk frames an N chunk is conditioned on

    def validate(self) -> None:
        w = self.seam_latents
        _check(w >= 0, "schedule.seam_latents", "must be >= 0")
        _check(self.boundary_latents >= 0, "schedule.boundary_latents", "must be >= 0")
        for key in ("chunk_latents", "first_chunk_latents"):
            _check(
                getattr(self, key) >= 2 * w + 1,
                f"schedule.{key}",
                f"must be >= 2*seam_latents+1 = {2 * w + 1} so each chunk keeps a body",
            )


@dataclass
class SamplerConfig:
    steps: int = 4
    shift: float = 3.0

    def validate(self) -> None:
        _check(1 <= self.steps <= 1000, "sampler.steps", "must be in [1, 1000]")
        _check(self.shift > 0, "sampler.shift", "must be > 0")


@dataclass
class PhotoConfig:
    """The photo stack (`runtime.stack: photo`, `pipeline/photo/`): a causal audio→motion
    model and a warping decoder that moves the reference photo's own pixels."""

    # audio→motion model (`pipeline/photo/motion.py`)
    n_mels: int = 40
    hidden: int = 96
    dilations: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    context_frames: int = 16  # left audio context per chunk, in video frames
    lookahead_frames: int = 2  # right context: the mouth leads the sound it shapes
    # warping decoder (`pipeline/photo/warp.py`), all in units of the face box width
    jaw_open: float = 0.11  # lip-to-lip gap at jaw = 1
    head_motion: float = 1.0  # scale of the idle/talking head sway (0: a still head)
    blink: bool = True
    # photo checks (`pipeline/photo/face.py`)
    max_image_bytes: int = 16 * 2**20
    max_image_pixels: int = 40_000_000
    min_face_px: int = 48  # smallest face box, in output pixels

    def validate(self) -> None:
        _check(self.hidden >= 8, "photo.hidden", "must be >= 8")
        _check(
            len(self.dilations) >= 1 and all(d >= 1 for d in self.dilations),
            "photo.dilations",
            "must be a non-empty list of dilations >= 1",
        )
        _check(self.context_frames >= 0, "photo.context_frames", "must be >= 0")
        _check(self.lookahead_frames >= 0, "photo.lookahead_frames", "must be >= 0")
        _check(0.0 <= self.jaw_open <= 0.3, "photo.jaw_open", "must be in [0, 0.3]")
        _check(0.0 <= self.head_motion <= 3.0, "photo.head_motion", "must be in [0, 3]")
        _check(self.max_image_bytes >= 1024, "photo.max_image_bytes", "must be >= 1024")
        _check(self.min_face_px >= 16, "photo.min_face_px", "must be >= 16")


@dataclass
class FlashHeadConfig:
    """SoulX-FlashHead from its published checkpoint (`runtime.stack: flashhead`,
    `pipeline/flashhead/`). Numbers are the authors' inference settings."""

    variant: str = "pro"  # "pro": Wan 2.1 VAE; "lite": LTX-Video VAE
    weights: str | None = None  # the release folder (Model_Pro/, VAE_Wan/, …); --weights
    wav2vec: str | None = None  # a facebook/wav2vec2-base-960h folder; --wav2vec
    chunk_frames: int = 33  # video frames a chunk generates, motion frames included
    motion_latents: int = 2  # latent frames handed from each chunk to the next
    steps: int = 4  # sampling steps, no guidance
    shift: float = 5.0  # timestep shift of the sampler
    color_correction: float = 1.0  # 0: off; 1: each frame's Lab statistics → the reference's
    audio_window_seconds: int = 8  # wav2vec2 re-reads this much audio every chunk
    face_ratio: float = 2.0  # the reference square is this many face widths wide
    # false: the reference is already a face-centred square (scaled and centre-cropped only)
    frame_reference: bool = True
    dtype: str = "auto"  # auto: bfloat16 on a GPU (as the authors run it), float32 on a CPU
    # Pro decodes a chunk's latent frames this many at a time after the first new one, whose
    # frames leave on their own as soon as they exist; 0: the chunk in one wide pass. Unset:
    # 2 on a GPU, where the pieces cost nothing (H200: 258 ms a chunk in 5 passes, 260 in
    # 2), 0 on a CPU, where every pass has a fixed cost of about 0.1 s at any size.
    decode_pass_latents: int | None = None
    # at most this many streams' steps run as one batch (those waiting when the GPU frees)
    batch_streams: int = 4

    def validate(self) -> None:
        _check(self.variant in ("pro", "lite"), "flashhead.variant", "must be pro or lite")
        _check(
            self.decode_pass_latents is None or self.decode_pass_latents >= 0,
            "flashhead.decode_pass_latents",
            "must be >= 0",
        )
        _check(self.batch_streams >= 1, "flashhead.batch_streams", "must be >= 1")
        _check(self.chunk_frames >= 9, "flashhead.chunk_frames", "must be >= 9")
        _check(self.motion_latents >= 1, "flashhead.motion_latents", "must be >= 1")
        _check(1 <= self.steps <= 50, "flashhead.steps", "must be in [1, 50]")
        _check(self.shift > 0, "flashhead.shift", "must be > 0")
        _check(
            0.0 <= self.color_correction <= 1.0, "flashhead.color_correction", "must be in [0, 1]"
        )
        _check(
            self.audio_window_seconds * FPS >= self.chunk_frames,
            "flashhead.audio_window_seconds",
            "must cover a chunk",
        )
        _check(1.0 <= self.face_ratio <= 4.0, "flashhead.face_ratio", "must be in [1, 4]")
        _check(
            self.dtype in ("auto", *DTYPES), "flashhead.dtype", f"must be auto or one of {DTYPES}"
        )


LIVEAVATAR_BLOCK_FRAMES = 12  # video frames a block adds: 3 latent frames of the Wan VAE
DEFAULT_PROMPT = (
    "A person talks to the camera, looking straight ahead, with natural expressions and "
    "small head movements; soft, even lighting; a plain background; realistic, sharp detail."
)


@dataclass
class LiveAvatarConfig:
    """LiveAvatar (Wan2.2-S2V-14B with the Live-Avatar LoRA) from its published checkpoint
    (`runtime.stack: liveavatar`, `pipeline/liveavatar/`). Numbers are the authors'
    streaming settings (`infinite_inference_single_gpu.sh`)."""

    weights: str | None = None  # the Wan2.2-S2V-14B folder; --weights
    lora: str | None = None  # the Live-Avatar LoRA file or folder; --lora
    wav2vec: str | None = None  # default: the release's wav2vec2-large-xlsr-53-english/
    prompt: str = DEFAULT_PROMPT  # what the umT5 encoder reads; --prompt, an offer's "prompt"
    steps: int = 4  # Euler steps a block, no guidance (the LoRA is distilled to 4)
    shift: float = 3.0  # the sampler's timestep shift
    ref_distance: int = 30  # latent frames the reference sits ahead of a block (authors: 4..30)
    audio_window_seconds: float = 4.0  # wav2vec2 re-reads this much audio every block
    audio_lookahead_frames: int = 2  # a block waits for this much audio past its end
    dtype: str = "auto"  # auto: bfloat16 on a GPU (as the authors run it), float32 on a CPU

    def validate(self) -> None:
        _check(1 <= self.steps <= 50, "liveavatar.steps", "must be in [1, 50]")
        _check(self.shift > 0, "liveavatar.shift", "must be > 0")
        _check(0 <= self.ref_distance <= 64, "liveavatar.ref_distance", "must be in [0, 64]")
        _check(
            1.0 <= self.audio_window_seconds <= 30.0,
            "liveavatar.audio_window_seconds",
            "must be in [1, 30]",
        )
        _check(
            abs(self.audio_window_seconds * FPS - round(self.audio_window_seconds * FPS)) < 1e-9,
            "liveavatar.audio_window_seconds",
            f"must be a whole number of frames (a multiple of {1 / FPS:g} s)",
        )
        _check(
            1 <= self.audio_lookahead_frames <= FPS,
            "liveavatar.audio_lookahead_frames",
            f"must be in [1, {FPS}] (wav2vec2's last state of a window falls short of its end)",
        )
        _check(bool(self.prompt.strip()), "liveavatar.prompt", "must not be empty")
        _check(
            self.dtype in ("auto", *DTYPES), "liveavatar.dtype", f"must be auto or one of {DTYPES}"
        )


@dataclass
class RuntimeConfig:
    stack: str = "diffusion"  # "diffusion": VAE + A2V/SR DiTs; "photo": warp the photo
    dtype: str = "float32"
    attention: str = "sdpa"
    weights: str | None = None  # safetensors path, or "package:NAME" for shipped weights
    init_seed: int = 0  # used when weights is None: deterministic random init

    def validate(self) -> None:
        _check(self.stack in STACKS, "runtime.stack", f"must be one of {STACKS}")
        _check(self.dtype in DTYPES, "runtime.dtype", f"must be one of {DTYPES}")
        _check(
            self.attention in ATTENTION_BACKENDS,
            "runtime.attention",
            f"must be one of {ATTENTION_BACKENDS}",
        )


@dataclass
class FacecastConfig:
    name: str = "custom"
    video: VideoConfig = field(default_factory=VideoConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    audio: AudioEncoderConfig = field(default_factory=AudioEncoderConfig)
    a2v: A2VConfig = field(default_factory=A2VConfig)
    sr: SRConfig = field(default_factory=SRConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    photo: PhotoConfig = field(default_factory=PhotoConfig)
    flashhead: FlashHeadConfig = field(default_factory=FlashHeadConfig)
    liveavatar: LiveAvatarConfig = field(default_factory=LiveAvatarConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    @property
    def frames_per_latent(self) -> int:
        """Video frames per schedule unit: the VAE's temporal ratio for the project's diffusion
        stack; 1 for the others (their chunks are counted in video frames)."""
        return self.vae.temporal_ratio if self.runtime.stack == "diffusion" else 1

    @property
    def vae_temporal_stride(self) -> int:
        """The VAE's temporal stride in video frames (after a stream's first latent frame):
        the project's causal VAE's ratio, 4 for FlashHead Pro's Wan VAE, 8 for Lite's
        LTX-Video VAE, 1 for the photo stack (no VAE). Chunk seams fall on latent starts."""
        if self.runtime.stack == "flashhead":
            return 4 if self.flashhead.variant == "pro" else 8
        if self.runtime.stack == "liveavatar":
            return 4  # the Wan 2.1 VAE
        if self.runtime.stack == "photo":
            return 1
        return self.vae.temporal_ratio

    @property
    def flashhead_new_frames(self) -> int:
        """Video frames a FlashHead chunk adds: its frames less the motion frames, which
        repeat the previous chunk's last ones (the first motion latent is one frame, each
        later one a temporal stride of frames)."""
        fh = self.flashhead
        stride = self.vae_temporal_stride
        return fh.chunk_frames - ((fh.motion_latents - 1) * stride + 1)

    @property
    def lookahead_frames(self) -> int:
        """Audio frames a chunk reads past its own end before it can run."""
        if self.runtime.stack == "photo":
            return self.photo.lookahead_frames
        if self.runtime.stack == "flashhead":
            return 0  # a chunk's last frames read their audio clamped at the chunk's end
        if self.runtime.stack == "liveavatar":
            return self.liveavatar.audio_lookahead_frames
        return self.audio.lookahead_frames

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, _Section):
                value.validate()
        if self.runtime.stack == "flashhead":
            new = self.flashhead_new_frames
            fh, sch = self.flashhead, self.schedule
            stride = self.vae_temporal_stride
            _check(
                (fh.chunk_frames - 1) % stride == 0,
                "flashhead.chunk_frames",
                f"must be 1 + a multiple of the VAE's temporal stride {stride}",
            )
            _check(
                sch.chunk_latents == new and sch.first_chunk_latents == new,
                "schedule",
                f"a FlashHead chunk adds {new} frames: chunk_latents and first_chunk_latents "
                f"must be {new}, seam and boundary 0",
            )
            _check(sch.seam_latents == 0 and sch.boundary_latents == 0, "schedule", "no seams")
        if self.runtime.stack == "liveavatar":
            sch, v = self.schedule, self.video
            block = LIVEAVATAR_BLOCK_FRAMES
            _check(
                sch.chunk_latents == block and sch.first_chunk_latents == block,
                "schedule",
                f"a LiveAvatar block adds {block} frames: chunk_latents and first_chunk_latents "
                f"must be {block}, seam and boundary 0",
            )
            _check(sch.seam_latents == 0 and sch.boundary_latents == 0, "schedule", "no seams")
            _check(
                v.width % 64 == 0 and v.height % 64 == 0,
                "video",
                f"LiveAvatar needs a size divisible by 64 (got {v.width}x{v.height}): the "
                "motion latents are packed 4x after the 2x2 patch",
            )
        grid = latent_grid(self)
        _check(
            grid.full_h % self.a2v.downscale == 0 and grid.full_w % self.a2v.downscale == 0,
            "a2v.downscale",
            f"must divide the latent grid {grid.full_h}x{grid.full_w}",
        )
        _, ph, pw = self.a2v.patch
        _check(
            grid.low_h % ph == 0 and grid.low_w % pw == 0,
            "a2v.patch",
            f"must divide the A2V latent grid {grid.low_h}x{grid.low_w}",
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


def load_config(name_or_path: str | Path, overrides: dict | None = None) -> FacecastConfig:
    """Load a preset from `configs/` by name, or any YAML file by path, then validate it.
    A preset may start from another (`base: rt720`) and change only some keys."""
    raw = _read_preset(name_or_path, seen=())
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    cfg = _build(FacecastConfig, raw, prefix="")
    cfg.validate()
    return cfg


def config_names() -> list[str]:
    """The presets in `configs/`, by name."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _read_preset(name_or_path: str | Path, seen: tuple[str, ...]) -> dict:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = CONFIG_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"unknown config {str(name_or_path)!r}; known configs: {config_names()}"
            )
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or base in seen or base == path.stem:
            raise ConfigError(f"config {path}: 'base' must name another preset (got {base!r})")
        merged = _read_preset(base, (*seen, path.stem))
        merged.pop("name", None)
        raw = _merge(merged, raw)
    raw.setdefault("name", path.stem)
    return raw


def _merge(base: dict, change: dict) -> dict:
    out = dict(base)
    for key, value in change.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def parse_overrides(items: list[str]) -> dict:
    """`["schedule.seam_latents=0", ...]` (command-line `--set`) → dotted overrides; values
    are read as JSON where they parse (numbers, booleans, lists), else kept as strings."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. sampler.steps=4")
        try:
            overrides[key] = json.loads(value)
        except ValueError:
            overrides[key] = value
    return overrides


def _build(cls: type, raw: dict, prefix: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(raw) - set(fields)
    if unknown:
        raise ConfigError(
            f"unknown config key '{prefix}{sorted(unknown)[0]}'; allowed: {sorted(fields)}"
        )
    kwargs = {}
    for name, value in raw.items():
        hint = hints[name]
        key = f"{prefix}{name}"
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, prefix=f"{key}.")
        else:
            kwargs[name] = _coerce(value, hint, key)
    return cls(**kwargs)


def _coerce(value, hint, key: str):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        hint = next(t for t in options if t is not type(None))
        origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"config key {key!r} must be a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"config key {key!r} must be {hint.__name__}, got {value!r}")
    return value


def _set_dotted(raw: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def _check(ok: bool, key: str, rule: str) -> None:
    if not ok:
        raise ConfigError(f"bad config value for {key}: {rule}")


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
