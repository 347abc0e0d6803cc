"""Typed configuration: a dataclass per section, loaded from YAML presets.

`load_config("tiny")` reads `configs/tiny.yaml`; a path to any YAML file works too. Unknown
keys, wrong types and out-of-range values raise `ConfigError` naming the key and what is
allowed. The shared sections are in `pipeline.sections`, each family's own in its folder
(`pipeline/diffusion/config.py`, ...); which of them a config uses, and the rules across
them, its family says (`pipeline.families`): only those are checked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline import families
from pipeline.diffusion import config as diffusion
from pipeline.diffusion.config import DiffusionConfig
from pipeline.errors import ConfigError
from pipeline.families import family_named, family_of
from pipeline.flashhead.config import FlashHeadConfig
from pipeline.liveavatar.config import DEFAULT_PROMPT, LIVEAVATAR_BLOCK_FRAMES, LiveAvatarConfig
from pipeline.photo.config import PhotoConfig
from pipeline.sections import ATTENTION_BACKENDS, DTYPES, RuntimeConfig, ScheduleConfig, VideoConfig

if typing.TYPE_CHECKING:
    from pipeline.families import Family

# the names other modules import from here (the sections moved out)
__all__ = [
    "ATTENTION_BACKENDS",
    "CONFIG_DIR",
    "DEFAULT_CONFIG",
    "DEFAULT_PROMPT",
    "DTYPES",
    "LIVEAVATAR_BLOCK_FRAMES",
    "FacecastConfig",
    "FlashHeadConfig",
    "LiveAvatarConfig",
    "PhotoConfig",
    "RuntimeConfig",
    "ScheduleConfig",
    "VideoConfig",
    "config_names",
    "load_config",
    "parse_overrides",
]

log = logging.getLogger("facecast.config")

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
# The default avatar: the photo stack animates the user's own photo (a bundled public-domain
# portrait without one); `demo` is the synthetic world's stack and its identities.
DEFAULT_CONFIG = "photo"
SHARED_SECTIONS = ("video", "schedule", "runtime")


@typing.runtime_checkable
class _Section(typing.Protocol):
    """A config section: checks its own values (`FacecastConfig.validate` calls each)."""

    def validate(self) -> None: ...


@dataclass
class FacecastConfig:
    """Every section a preset may hold (so every preset loads into one type); a config uses
    those its family names (`sections`)."""

    name: str = "custom"
    video: VideoConfig = field(default_factory=VideoConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    photo: PhotoConfig = field(default_factory=PhotoConfig)
    flashhead: FlashHeadConfig = field(default_factory=FlashHeadConfig)
    liveavatar: LiveAvatarConfig = field(default_factory=LiveAvatarConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    # the sections of families added at run time, by stack (`load_config` fills it)
    added_sections: dict[str, _Section] = field(default_factory=dict, init=False, repr=False)

    @property
    def family(self) -> Family:
        return family_of(self)

    @property
    def sections(self) -> dict[str, _Section]:
        """The sections this config's family reads, by key: the shared ones and its own."""
        family = self.family
        keys = [*SHARED_SECTIONS[:2], *family.sections, SHARED_SECTIONS[2]]
        out = {key: getattr(self, key) for key in keys}
        if family.section is not None:  # an added family's: its preset's, or the defaults
            out[family.stack] = self.added_sections.get(family.stack) or family.section()
        return out

    def section(self, kind: type[_S]) -> _S:
        """The one section of type `kind` this config's family reads."""
        for value in self.sections.values():
            if isinstance(value, kind):
                return value
        raise ConfigError(f"config {self.name!r} ({self.family.stack}) has no {kind.__name__}")

    @property
    def frames_per_latent(self) -> int:
        """Video frames per schedule unit: the VAE's temporal ratio for a family that counts
        latent frames (the project's diffusion stack), 1 for the others."""
        return self.diffusion.vae.temporal_ratio if self.family.counts_latents else 1

    @property
    def vae_temporal_stride(self) -> int:
        """The VAE's temporal stride in video frames (after a stream's first latent frame),
        as the family says (1 without a VAE). Chunk seams fall on latent starts."""
        return self.family.temporal_stride(self)

    @property
    def flashhead_new_frames(self) -> int:
        """Video frames a FlashHead chunk adds (`FlashHeadConfig.new_frames`)."""
        return self.flashhead.new_frames

    @property
    def lookahead_frames(self) -> int:
        """Audio frames a chunk reads past its own end before it can run."""
        return self.family.lookahead_frames(self)

    def validate(self) -> None:
        family = family_named(self.runtime.stack)  # an unknown stack names the known ones
        for value in self.sections.values():
            value.validate()
        if family.check_config is not None:
            family.check_config(self)


_S = typing.TypeVar("_S")


def load_config(name_or_path: str | Path, overrides: dict | None = None) -> FacecastConfig:
    """Load a preset from `configs/` by name, or any YAML file by path, then validate it.
    A preset may start from another (`base: rt720`) and change only some keys. The diffusion
    stack's sections at the top level (the form before they went under `diffusion:`), in a
    preset or an override, still load, with one warning saying what to move where."""
    flat: list[str] = []  # where the old form was found, for the one warning
    raw = _read_preset(name_or_path, seen=(), flat=flat)
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    _nest_diffusion_sections(raw, "the overrides (--set)", flat)
    if flat:
        log.warning(
            "config %s: move %s under 'diffusion:' (diffusion.vae, diffusion.audio, "
            "diffusion.a2v, diffusion.sr, diffusion.sampler, as configs/tiny.yaml has them); "
            "the diffusion stack's sections at the top level are deprecated",
            raw["name"],
            " and ".join(flat),
        )
    # a section of a family added at run time (`pipeline.families.register`) is its own
    own = {
        f.stack: _build(f.section, raw.pop(f.stack), prefix=f"{f.stack}.")
        for f in families.FAMILIES
        if f.section is not None and isinstance(raw.get(f.stack), dict)
    }
    cfg = _build(FacecastConfig, raw, prefix="")
    cfg.added_sections = own
    cfg.validate()
    return cfg


def config_names() -> list[str]:
    """The presets in `configs/`, by name."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _read_preset(name_or_path: str | Path, seen: tuple[str, ...], flat: list[str]) -> dict:
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
    _nest_diffusion_sections(raw, str(path), flat)
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or base in seen or base == path.stem:
            raise ConfigError(f"config {path}: 'base' must name another preset (got {base!r})")
        merged = _read_preset(base, (*seen, path.stem), flat)
        merged.pop("name", None)
        raw = _merge(merged, raw)
    raw.setdefault("name", path.stem)
    return raw


def _nest_diffusion_sections(raw: dict, where: str, flat: list[str]) -> None:
    """Move the diffusion stack's sections found at the top level of `raw` (the old form)
    under its `diffusion` key, checked as written (an error names the key where it is), and
    note in `flat` what moved from `where`."""
    keys = [key for key in diffusion.SECTIONS if key in raw]
    if not keys:
        return
    nested = raw.setdefault("diffusion", {})
    if not isinstance(nested, dict):
        raise ConfigError(f"diffusion must be a mapping, got {nested!r}")
    for key in keys:
        value = raw.pop(key)
        _build(diffusion.SECTIONS[key], value, prefix=f"{key}.")
        nested[key] = _merge(nested[key], value) if isinstance(nested.get(key), dict) else value
    flat.append(f"{', '.join(keys)} from the top level of {where}")


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
            raise ConfigError(
                f"override {item!r}: expected KEY=VALUE, e.g. diffusion.sampler.steps=4"
            )
        try:
            overrides[key] = json.loads(value)
        except ValueError:
            overrides[key] = value
    return overrides


def _build(cls: type, raw: dict, prefix: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # a preset's keys
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
