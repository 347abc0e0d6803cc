"""LTX-Video's causal video VAE, the pixel codec of SoulX-FlashHead Lite.

The network is diffusers' `AutoencoderKLLTXVideo` (the LTX-Video 0.9.0 VAE: 128 latent
channels, 8x32x32 compression, pixel-norm resnets, no timestep conditioning, no decoder
noise, a causal encoder and a non-causal decoder). This file owns what diffusers leaves to
the caller: reading the published folder strictly, and the latent convention of FlashHead
Lite (a sample of the posterior, then per-channel normalisation with the checkpoint's own
`latents_mean` / `latents_std`).

The published folder (`VAE_LTX/` of `huggingface-cli download Soul-AILab/SoulX-FlashHead-1_3B`):

    config.json                          diffusers config of AutoencoderKLLTXVideo (0.9.0 keys)
    diffusion_pytorch_model.safetensors  the weights under diffusers' names, with the
                                         per-channel statistics `latents_mean`/`latents_std`

The file's names are the network's names, so the key table is the identity; anything
missing, extra or mis-shaped is a `CheckpointError` naming the file.

Legend: B batch; C channels (3 for pixels, `latent_channels` = 128 for latents); T video
frames, T = 1 + 8k; t = 1 + k latent frames; H, W pixels; h = H/32, w = W/32 latent pixels.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from pipeline.errors import CheckpointError

if TYPE_CHECKING:
    from diffusers import AutoencoderKLLTXVideo

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
CLASS_NAME = "AutoencoderKLLTXVideo"
# The posterior's log-variance is clamped as diffusers' DiagonalGaussianDistribution does.
LOGVAR_MIN, LOGVAR_MAX = -30.0, 20.0


@dataclass(frozen=True)
class LtxVaeConfig:
    """The keys of the published `config.json` (the LTX-Video 0.9.0 VAE in diffusers' terms)."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: tuple[int, ...] = (4, 3, 3, 3, 4)
    spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, False)
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    scaling_factor: float = 1.0
    encoder_causal: bool = True
    decoder_causal: bool = False

    @property
    def spatial_stride(self) -> int:
        return self.patch_size * 2 ** sum(self.spatio_temporal_scaling)

    @property
    def temporal_stride(self) -> int:
        return self.patch_size_t * 2 ** sum(self.spatio_temporal_scaling)

    def to_json(self) -> dict[str, Any]:
        """The config as the release writes it (diffusers' `config.json`)."""
        out: dict[str, Any] = {"_class_name": CLASS_NAME, "_diffusers_version": "0.32.0.dev0"}
        out.update({k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()})
        return out


# The VAE FlashHead Lite ships, and a tiny one of the same structure for CPU tests.
RELEASE = LtxVaeConfig()
TINY = LtxVaeConfig(
    latent_channels=8, block_out_channels=(2, 4, 8, 8), layers_per_block=(1, 1, 1, 1, 1)
)

# Keys that later diffusers versions write; accepted only at the 0.9.0 meaning, since
# FlashHead's decoder is called with no timestep and no noise. `None` = derived, see below.
_PINNED: dict[str, Any] = {
    "down_block_types": ["LTXVideoDownBlock3D"] * 4,
    "downsample_type": ["conv"] * 4,
    "decoder_inject_noise": [False] * 5,
    "upsample_residual": [False] * 4,
    "upsample_factor": [1] * 4,
    "timestep_conditioning": False,
    "decoder_block_out_channels": None,  # = block_out_channels
    "decoder_layers_per_block": None,  # = layers_per_block
    "decoder_spatio_temporal_scaling": None,  # = spatio_temporal_scaling
    "spatial_compression_ratio": None,  # null or = the derived stride
    "temporal_compression_ratio": None,
}
_MIRRORED = {
    "decoder_block_out_channels": "block_out_channels",
    "decoder_layers_per_block": "layers_per_block",
    "decoder_spatio_temporal_scaling": "spatio_temporal_scaling",
}


def _fail(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: {what}")


def _typed(path: Path, key: str, value: Any, default: Any) -> Any:
    """`value` checked against the type of the dataclass default (lists become tuples)."""
    if isinstance(default, tuple):
        kind = type(default[0])
        ok = isinstance(value, list) and len(value) == len(default)
        ok = ok and all(
            isinstance(v, kind) and (kind is bool or not isinstance(v, bool)) for v in value
        )
        if not ok:
            raise _fail(
                path, f"{key}={value!r} should be a list of {len(default)} {kind.__name__}s"
            )
        return tuple(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise _fail(path, f"{key}={value!r} should be true or false")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _fail(path, f"{key}={value!r} should be a positive number")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(path, f"{key}={value!r} should be a positive integer")
    return value


def read_config(path: Path) -> LtxVaeConfig:
    """Parse and check a published `config.json`; every problem is one line naming the file."""
    if not path.is_file():
        raise _fail(
            path, "not found (the VAE_LTX folder needs config.json and " + WEIGHTS_FILE + ")"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"is not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise _fail(path, "should hold a JSON object of the VAE's settings")
    if raw.get("_class_name") != CLASS_NAME:
        raise _fail(path, f"_class_name={raw.get('_class_name')!r}, expected {CLASS_NAME!r}")
    defaults = {f.name: f.default for f in fields(LtxVaeConfig)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key.startswith("_") or key in _PINNED:
            continue
        if key not in defaults:
            allowed = sorted([*defaults, *_PINNED])
            raise _fail(path, f"unknown key {key!r} (known: {', '.join(allowed)})")
        values[key] = _typed(path, key, value, defaults[key])
    cfg = LtxVaeConfig(**values)
    _check_structure(path, cfg)
    for key, pinned in _PINNED.items():
        if key in raw and raw[key] is not None:
            _check_pinned(path, cfg, key, raw[key], pinned)
    return cfg


def _check_structure(path: Path, cfg: LtxVaeConfig) -> None:
    n = len(cfg.block_out_channels)
    if len(cfg.spatio_temporal_scaling) != n or len(cfg.layers_per_block) != n + 1:
        raise _fail(
            path,
            f"block_out_channels has {n} entries, so spatio_temporal_scaling needs {n} and "
            f"layers_per_block {n + 1} (got {len(cfg.spatio_temporal_scaling)} and "
            f"{len(cfg.layers_per_block)})",
        )
    if cfg.patch_size_t != 1:
        raise _fail(path, f"patch_size_t={cfg.patch_size_t}: only 1 (LTX-Video 0.9.0) is supported")


def _check_pinned(path: Path, cfg: LtxVaeConfig, key: str, value: Any, pinned: Any) -> None:
    if key in _MIRRORED:
        pinned = list(getattr(cfg, _MIRRORED[key]))
    elif key == "spatial_compression_ratio":
        pinned = cfg.spatial_stride
    elif key == "temporal_compression_ratio":
        pinned = cfg.temporal_stride
    if value != pinned:
        raise _fail(
            path,
            f"{key}={value!r} is not the LTX-Video 0.9.0 VAE that SoulX-FlashHead Lite ships "
            f"(expected {pinned!r}); later VAEs (timestep conditioning, decoder noise) are not "
            "supported",
        )


def build_network(cfg: LtxVaeConfig, device: torch.device | str = "cpu") -> AutoencoderKLLTXVideo:
    """diffusers' AutoencoderKLLTXVideo for `cfg` (parameters on `device`, `meta` for none).
    diffusers is imported here, not at the top: it takes seconds, and only this model needs it."""
    from diffusers import AutoencoderKLLTXVideo

    # The 0.9.0 config has one set of block keys; later diffusers split off decoder_* keys
    # whose defaults are the release's sizes, so they are passed explicitly (mirrored).
    kwargs = asdict(cfg)
    kwargs.update({dec: kwargs[enc] for dec, enc in _MIRRORED.items()})
    with torch.device(device):
        return AutoencoderKLLTXVideo(**kwargs)


def read_weights(path: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """The safetensors file as a state dict, checked key by key against `expected` shapes."""
    if not path.is_file():
        raise _fail(
            path, "not found (the VAE_LTX folder needs config.json and " + WEIGHTS_FILE + ")"
        )
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise _fail(path, f"is not a readable safetensors file ({exc})") from None
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise _fail(path, f"{len(unknown)} key(s) the LTX VAE does not have, e.g. {unknown[:3]}")
    if missing:
        raise _fail(path, f"{len(missing)} key(s) missing, e.g. {missing[:3]}")
    for key, shape in expected.items():
        got = tuple(state[key].shape)
        if got != shape:
            raise _fail(path, f"{key} has shape {got}, the config says {shape}")
        if not state[key].is_floating_point():
            raise _fail(path, f"{key} has dtype {state[key].dtype}, expected a float dtype")
    if not bool((state["latents_std"] > 0).all()):
        raise _fail(path, "latents_std has entries <= 0; the latents could not be normalised")
    return state


class LtxVae:
    """The VAE with FlashHead Lite's latent convention (see `encode` and `decode`)."""

    def __init__(self, network: AutoencoderKLLTXVideo, config: LtxVaeConfig) -> None:
        self.network = network.eval().requires_grad_(False)
        self.config = config

    @property
    def device(self) -> torch.device:
        return self.network.latents_mean.device

    @property
    def dtype(self) -> torch.dtype:
        return self.network.latents_mean.dtype

    def _stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        mean = self.network.latents_mean.to(like.dtype).view(1, -1, 1, 1, 1)
        std = self.network.latents_std.to(like.dtype).view(1, -1, 1, 1, 1)
        return mean, std

    def encode(
        self, video_BCTHW: Tensor, *, sample: bool = True, generator: torch.Generator | None = None
    ) -> Tensor:
        """Pixels in [-1, 1], T = 1 + 8k frames, H and W multiples of 32 -> normalised
        latents (B, 128, 1 + k, H/32, W/32).

        `sample=True` is FlashHead's `LtxVAE.encode`: a draw `mean + std * noise` of the
        posterior, the noise from `generator` (the global RNG when None, as theirs), of the
        latents' shape, device and dtype. `sample=False` returns the posterior mean: the
        deterministic choice (the draw differs from it by `std` times unit noise)."""
        b, c, t, h, w = video_BCTHW.shape
        s, st = self.config.spatial_stride, self.config.temporal_stride
        if c != self.config.in_channels or (t - 1) % st or h % s or w % s:
            raise ValueError(
                f"LTX VAE input {tuple(video_BCTHW.shape)}: expected (B, {self.config.in_channels},"
                f" 1 + {st}k, H, W) with H and W multiples of {s}"
            )
        moments = self.network.encoder(video_BCTHW.to(self.device, self.dtype))
        mean_BCthw, logvar_BCthw = moments.chunk(2, dim=1)
        z_BCthw = mean_BCthw
        if sample:
            std = torch.exp(0.5 * logvar_BCthw.clamp(LOGVAR_MIN, LOGVAR_MAX))
            z_BCthw = mean_BCthw + std * _noise_like(mean_BCthw, generator)
        lat_mean, lat_std = self._stats(z_BCthw)
        return (z_BCthw - lat_mean) / lat_std

    def decode(self, lat_BCthw: Tensor) -> Tensor:
        """Normalised latents (B, 128, t, h, w) -> pixels (B, 3, 1 + 8(t - 1), 32h, 32w),
        about [-1, 1] (not clamped, as FlashHead's `LtxVAE.decode`)."""
        if lat_BCthw.dim() != 5 or lat_BCthw.shape[1] != self.config.latent_channels:
            raise ValueError(
                f"LTX VAE latents {tuple(lat_BCthw.shape)}: expected "
                f"(B, {self.config.latent_channels}, t, h, w)"
            )
        z_BCthw = lat_BCthw.to(self.device, self.dtype)
        lat_mean, lat_std = self._stats(z_BCthw)
        return self.network.decoder(z_BCthw * lat_std + lat_mean, None)


def _noise_like(x: Tensor, generator: torch.Generator | None) -> Tensor:
    """Unit noise as diffusers' `randn_tensor` draws it: on the generator's device, then moved."""
    device = x.device if generator is None else generator.device
    return torch.randn(x.shape, generator=generator, device=device, dtype=x.dtype).to(x.device)


def load_ltx_vae(
    weights_dir: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
) -> LtxVae:
    """Load the published `VAE_LTX/` folder (config.json + diffusion_pytorch_model.safetensors)
    strictly; any problem is a one-line `CheckpointError` naming the file."""
    root = Path(weights_dir).expanduser()
    if not root.is_dir():
        raise CheckpointError(
            f"{root}: LTX VAE folder not found (it is VAE_LTX/ of "
            "`huggingface-cli download Soul-AILab/SoulX-FlashHead-1_3B`)"
        )
    cfg = read_config(root / CONFIG_FILE)
    network = build_network(cfg, "meta")
    expected = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    state = read_weights(root / WEIGHTS_FILE, expected)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    network.load_state_dict(state, strict=True, assign=True)
    left = [n for n, t in [*network.named_parameters(), *network.named_buffers()] if t.is_meta]
    assert not left, f"tensors the checkpoint did not fill: {left[:3]}"
    return LtxVae(network, cfg)


def latent_shape(cfg: LtxVaeConfig, frames: int, height: int, width: int) -> tuple[int, ...]:
    """(C, t, h, w) of the latents of a (3, frames, height, width) clip."""
    s, st = cfg.spatial_stride, cfg.temporal_stride
    return (cfg.latent_channels, 1 + (frames - 1) // st, height // s, width // s)
