"""The Wan 2.1 causal video VAE (4x8x8, 16 channels): what the open avatar models decode with.

SoulX-FlashHead "Pro", InfiniteTalk, LiveAvatar and most 2025-26 avatar models turn their
DiT's latents into pixels with this VAE. Users download its published checkpoint
(`Wan2.1_VAE.pth`, a plain torch state dict: `encoder.*`, `decoder.*`, `conv1.*`, `conv2.*`);
`load_wan_vae` reads it into diffusers' `AutoencoderKLWan` through one explicit key table.

The network is diffusers'; the caches are ours. Its encoder and decoder take a list of
per-convolution look-backs (`feat_cache`) that they read and update in place; this file
owns those lists, so a decode can stop after any latent frame and resume later:

- `WanVAE.encode(video)`: a fresh cache per call; the first frame goes in alone, then the
  rest in one pass.
- `WanDecodeStream`: one per chunk of latents; `decode(z)` takes one or more latent frames,
  returns their pixels and keeps the cache for the next call. The first latent frame of a
  stream gives 1 video frame, every later one gives 4; latent frames after the first go
  through the decoder together (one wide pass instead of one per frame: the same pixels).
- `WanVAE.decode(latents)`: a whole chunk through a fresh stream.

Latents are normalised with the 16 published per-channel means and standard deviations:
`encode` returns `(mu - mean) / std`, `decode` undoes it before `post_quant_conv`.
Decoded pixels are clamped to [-1, 1].

Legend: B batch, C latent channels (z_dim, 16), T latent frames, F video frames
(1 + 4 (T - 1) for a whole chunk), H/W pixels, h/w latent grid (H/8, W/8).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
from torch import Tensor, nn

from pipeline.checkpoints import read_state_dict
from pipeline.errors import CheckpointError
from pipeline.models.wan.vae_decode import CL3D, CausalDecoder, LookBack

# Per-channel statistics of Wan 2.1 latents (published with the model).
LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip

# One causal convolution's look-back: a tensor, None before the first frame, or the string
# "Rep" that diffusers' temporal upsampler leaves after the first latent frame.
FeatCache = list[Tensor | str | None]


@dataclass(frozen=True)
class WanVAEConfig:
    """Sizes of the Wan 2.1 VAE. `WAN21_VAE` is the published model; `WAN21_VAE_TINY` is the
    same network, narrower, for CPU tests and parity fixtures."""

    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_downsample: tuple[bool, ...] = (False, True, True)
    latents_mean: tuple[float, ...] = field(default=LATENTS_MEAN)
    latents_std: tuple[float, ...] = field(default=LATENTS_STD)

    def __post_init__(self) -> None:
        assert len(self.temporal_downsample) == len(self.dim_mult) - 1
        assert len(self.latents_mean) == len(self.latents_std) == self.z_dim

    @property
    def temporal_ratio(self) -> int:
        """Video frames per latent frame (after the first, which is 1 to 1)."""
        return 2 ** sum(self.temporal_downsample)

    @property
    def spatial_ratio(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)


WAN21_VAE = WanVAEConfig()
WAN21_VAE_TINY = WanVAEConfig(base_dim=8)


class WanVAE(nn.Module):
    """diffusers' `AutoencoderKLWan` (as `net`) plus the latent normalisation and our caches."""

    def __init__(self, config: WanVAEConfig = WAN21_VAE) -> None:
        super().__init__()
        self.config = config
        self.net = AutoencoderKLWan(
            base_dim=config.base_dim,
            z_dim=config.z_dim,
            dim_mult=list(config.dim_mult),
            num_res_blocks=config.num_res_blocks,
            attn_scales=[],
            temperal_downsample=list(config.temporal_downsample),
            latents_mean=list(config.latents_mean),
            latents_std=list(config.latents_std),
        )
        # explicit device: built on "meta" by the loader, these are not in the checkpoint
        std = torch.tensor(config.latents_std, device="cpu")
        mean = torch.tensor(config.latents_mean, device="cpu")
        self.latent_mean: Tensor
        self.latent_inv_std: Tensor
        self.register_buffer("latent_mean", mean, persistent=False)
        self.register_buffer("latent_inv_std", 1.0 / std, persistent=False)
        count = lambda m: sum(isinstance(c, WanCausalConv3d) for c in m.modules())  # noqa: E731
        self.encoder_cache_size = count(self.net.encoder)
        self.decoder_cache_size = count(self.net.decoder)
        self._causal_decoder: CausalDecoder | None = None
        self._encoder_layout = torch.contiguous_format  # `compile_encoder`: channels-last

    @property
    def causal_decoder(self) -> CausalDecoder:
        """The decoder's weights run channels-last, pass by pass (`vae_decode`); made on
        first use, once the weights are loaded and placed."""
        if self._causal_decoder is None:
            self._causal_decoder = CausalDecoder(self.net.decoder)
        return self._causal_decoder

    def compile_encoder(self, mode: str | None = None, compile: bool = True) -> None:
        """Run the encoder channels-last, as the decoder runs (`vae_decode`): its
        convolutions' weights stored so, in place, and each clip laid out so at its input,
        the layout cuDNN's sm90 implicit-GEMM kernels read (channels-first, the H200 most
        likely ran a Pro chunk's motion re-encode on its sm80 ones); then, with `compile`,
        torch.compile fuses its norms, SiLUs and causal look-back copies between the
        convolutions (one graph a pass length: the first frame alone, then four). The same
        sums."""
        for module in self.net.encoder.modules():
            if isinstance(module, nn.Conv3d):
                module.weight.data = module.weight.data.contiguous(memory_format=CL3D)
        self._encoder_layout = CL3D
        if compile:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self.net.encoder.forward = torch.compile(
                self.net.encoder.forward, mode=mode, dynamic=False
            )

    def encode(self, video_BCFHW: Tensor) -> Tensor:
        """Pixels in [-1, 1] with F = 1 + 4k frames → normalised latent means (B, C, 1 + k, h, w)."""
        B, _, F, H, W = video_BCFHW.shape
        r, s = self.config.temporal_ratio, self.config.spatial_ratio
        if (F - 1) % r or H % s or W % s:
            raise ValueError(
                f"encode needs 1 + {r}k frames of a size divisible by {s}; got {F} frames of {H}x{W}"
            )
        video_BCFHW = video_BCFHW.contiguous(memory_format=self._encoder_layout)
        cache: FeatCache = [None] * self.encoder_cache_size
        # the first frame alone (the encoder treats it apart), then the rest in one pass:
        # the authors feed 4 at a time, the same causal computation (equal to float
        # rounding), and 4x faster on a 73-frame clip
        bounds = [(0, 1), (1, F)] if F > 1 else [(0, 1)]
        parts = [
            self.net.encoder(video_BCFHW[:, :, lo:hi], feat_cache=cache, feat_idx=[0])
            for lo, hi in bounds
        ]
        mu_BCThw = self.net.quant_conv(torch.cat(parts, dim=2))[:, : self.config.z_dim]
        return (mu_BCThw - _per_channel(self.latent_mean)) * _per_channel(self.latent_inv_std)

    def stream(self, reference: bool = False) -> WanDecodeStream:
        """A fresh decode of one chunk: feed it its latent frames in order, in any split.
        `reference`: through diffusers' own forward and caches (the gate's baseline)."""
        return WanDecodeStream(self, reference)

    def decode(self, lat_BCThw: Tensor) -> Tensor:
        """A whole chunk of normalised latents → pixels (B, 3, 1 + 4 (T - 1), H, W) in [-1, 1]."""
        return self.stream().decode(lat_BCThw)


class WanDecodeStream:
    """The decoder's state across one chunk: the causal cache and how many latent frames
    went in. The stream's very first latent frame runs alone (the temporal upsamplers treat
    it apart: 1 video frame, not 4); later ones run together, as many per pass as asked.
    Every convolution in time is causal and reads its look-back from the cache, so a pass
    over k latent frames gives the pixels of k passes over one (the same sums, in another
    order: equal to float rounding), and every split of a chunk gives the same pixels."""

    def __init__(self, vae: WanVAE, reference: bool = False) -> None:
        self.vae = vae
        self.reference = reference
        self.cache: FeatCache = [None] * vae.decoder_cache_size  # diffusers' (reference)
        self.look_back = LookBack()  # the causal decoder's
        self.latent_frames = 0

    def frames(
        self,
        lat_BCThw: Tensor,
        latents_per_pass: int | None = None,
        passes: Sequence[int] = (),
    ) -> Iterator[Tensor]:
        """Yield pixels pass by pass: (B, 3, 1, H, W) for the stream's first latent frame,
        then (B, 3, 4k, H, W) for each pass over k latent frames: the next of `passes`
        while there are any, then `latents_per_pass`, or all that are left when None (one
        wide pass keeps the GPU busy, short passes let the first frames leave sooner). The
        cache advances with each yield: a consumer that stops early can go on with the
        next latent frame later."""
        if latents_per_pass is not None and latents_per_pass < 1:
            raise ValueError(f"latents_per_pass must be at least 1, got {latents_per_pass}")
        if any(n < 1 for n in passes):
            raise ValueError(f"passes must be of at least 1 latent frame, got {list(passes)}")
        net = self.vae.net
        inv_std, mean = _per_channel(self.vae.latent_inv_std), _per_channel(self.vae.latent_mean)
        z_BCThw = lat_BCThw / inv_std + mean
        T, t = z_BCThw.shape[2], 0
        planned = list(passes)
        while t < T:
            first = self.latent_frames == 0
            asked = planned.pop(0) if planned and not first else latents_per_pass or T
            n = 1 if first else min(asked, T - t)
            x_BCnhw = net.post_quant_conv(z_BCThw[:, :, t : t + n])
            if self.reference:
                out = net.decoder(x_BCnhw, feat_cache=self.cache, feat_idx=[0], first_chunk=first)
            else:
                out = self.vae.causal_decoder(x_BCnhw, self.look_back)
            self.latent_frames += n
            t += n
            yield out.clamp_(-1.0, 1.0)

    def decode(self, lat_BCThw: Tensor, latents_per_pass: int | None = None) -> Tensor:
        """One or more latent frames → their pixels (B, 3, F, H, W): F = 4T, or 4T - 3 when
        they open the stream."""
        if lat_BCThw.shape[2] == 0:
            raise ValueError("decode needs at least one latent frame")
        return torch.cat(list(self.frames(lat_BCThw, latents_per_pass)), dim=2)


def _per_channel(v_C: Tensor) -> Tensor:
    return v_C.view(1, -1, 1, 1, 1)


# ---- the published checkpoint's layout ------------------------------------------------------
# Original block (`WanVAE_` of the Wan 2.1 release) → diffusers block, then the leaves inside.
_CONV = (("weight", "weight"), ("bias", "bias"))
_GAMMA = (("gamma", "gamma"),)
_RESIDUAL = (
    ("residual.0.gamma", "norm1.gamma"),
    ("residual.2.weight", "conv1.weight"),
    ("residual.2.bias", "conv1.bias"),
    ("residual.3.gamma", "norm2.gamma"),
    ("residual.6.weight", "conv2.weight"),
    ("residual.6.bias", "conv2.bias"),
)
_SHORTCUT = (("shortcut.weight", "conv_shortcut.weight"), ("shortcut.bias", "conv_shortcut.bias"))
_ATTENTION = (
    ("norm.gamma", "norm.gamma"),
    ("to_qkv.weight", "to_qkv.weight"),
    ("to_qkv.bias", "to_qkv.bias"),
    ("proj.weight", "proj.weight"),
    ("proj.bias", "proj.bias"),
)
_RESAMPLE_2D = (("resample.1.weight", "resample.1.weight"), ("resample.1.bias", "resample.1.bias"))
_TIME_CONV = (("time_conv.weight", "time_conv.weight"), ("time_conv.bias", "time_conv.bias"))
_RESAMPLE_3D = _RESAMPLE_2D + _TIME_CONV


def checkpoint_layout(config: WanVAEConfig = WAN21_VAE) -> dict[str, str]:
    """Every key of the published checkpoint → the parameter of `WanVAE` it fills."""
    blocks: list[tuple[str, str, tuple[tuple[str, str], ...]]] = [
        ("conv1", "quant_conv", _CONV),
        ("conv2", "post_quant_conv", _CONV),
        ("encoder.conv1", "encoder.conv_in", _CONV),
        ("decoder.conv1", "decoder.conv_in", _CONV),
    ]
    for side in ("encoder", "decoder"):
        blocks += [
            (f"{side}.middle.0", f"{side}.mid_block.resnets.0", _RESIDUAL),
            (f"{side}.middle.1", f"{side}.mid_block.attentions.0", _ATTENTION),
            (f"{side}.middle.2", f"{side}.mid_block.resnets.1", _RESIDUAL),
            (f"{side}.head.0", f"{side}.norm_out", _GAMMA),
            (f"{side}.head.2", f"{side}.conv_out", _CONV),
        ]
    levels = len(config.dim_mult)
    # Encoder: one flat list in both, numbered alike: each level's residual blocks, then
    # its downsampler (none after the last level).
    dims = [config.base_dim * m for m in (1, *config.dim_mult)]
    n = 0
    for level in range(levels):
        c_in, c_out = dims[level], dims[level + 1]
        for _ in range(config.num_res_blocks):
            leaves = _RESIDUAL + (_SHORTCUT if c_in != c_out else ())
            blocks.append((f"encoder.downsamples.{n}", f"encoder.down_blocks.{n}", leaves))
            c_in, n = c_out, n + 1
        if level < levels - 1:
            leaves = _RESAMPLE_3D if config.temporal_downsample[level] else _RESAMPLE_2D
            blocks.append((f"encoder.downsamples.{n}", f"encoder.down_blocks.{n}", leaves))
            n += 1
    # Decoder: the original's flat list → up_blocks[level].resnets[j] and .upsamplers.0; each
    # level has one residual block more than the encoder's, and its upsampler halves the width.
    dims = [config.base_dim * m for m in (config.dim_mult[-1], *reversed(config.dim_mult))]
    temporal_upsample = tuple(reversed(config.temporal_downsample))
    n = 0
    for level in range(levels):
        c_in, c_out = dims[level] // (2 if level else 1), dims[level + 1]
        for j in range(config.num_res_blocks + 1):
            leaves = _RESIDUAL + (_SHORTCUT if c_in != c_out else ())
            ours = f"decoder.up_blocks.{level}.resnets.{j}"
            blocks.append((f"decoder.upsamples.{n}", ours, leaves))
            c_in, n = c_out, n + 1
        if level < levels - 1:
            leaves = _RESAMPLE_3D if temporal_upsample[level] else _RESAMPLE_2D
            ours = f"decoder.up_blocks.{level}.upsamplers.0"
            blocks.append((f"decoder.upsamples.{n}", ours, leaves))
            n += 1
    return {f"{src}.{a}": f"net.{dst}.{b}" for src, dst, leaves in blocks for a, b in leaves}


def load_wan_vae(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    config: WanVAEConfig | None = WAN21_VAE,
) -> WanVAE:
    """Read a published Wan 2.1 VAE checkpoint (`Wan2.1_VAE.pth`) strictly; any mismatch is
    a one-line `CheckpointError` naming the file and the first wrong key. `config=None`
    takes the width from the file (the published 96, or a narrower test checkpoint)."""
    path = Path(path)
    state = read_state_dict(path)
    if config is None:
        first = state.get("encoder.conv1.weight")
        if first is None or first.dim() != 5:
            raise CheckpointError(f"{path}: no 5-D 'encoder.conv1.weight'; not a Wan 2.1 VAE")
        config = (
            WAN21_VAE
            if first.shape[0] == WAN21_VAE.base_dim
            else WanVAEConfig(base_dim=first.shape[0])
        )
    layout = checkpoint_layout(config)
    with torch.device("meta"):
        vae = WanVAE(config)
    expected = vae.state_dict()
    assert set(layout.values()) == set(expected), "checkpoint_layout is out of step with WanVAE"
    mapped = {}
    for name, tensor in state.items():
        if name not in layout:
            raise CheckpointError(
                f"{path}: key {name!r} is not part of the Wan 2.1 VAE ({len(state)} keys in the "
                f"file, {len(layout)} expected); pass the original Wan2.1_VAE.pth, not a "
                "diffusers or other conversion"
            )
        if not tensor.is_floating_point():
            raise CheckpointError(
                f"{path}: {name} holds {tensor.dtype}, not floating point weights; "
                "pass the original Wan2.1_VAE.pth"
            )
        want = expected[layout[name]].shape
        if tensor.shape != want:
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(tensor.shape)} but this config expects "
                f"{tuple(want)}; the file was made for other sizes than base_dim="
                f"{config.base_dim}, z_dim={config.z_dim}"
            )
        mapped[layout[name]] = tensor.to(dtype)
    missing = [name for name in layout if name not in state]
    if missing:
        raise CheckpointError(
            f"{path}: key {missing[0]!r} is missing ({len(missing)} of {len(layout)} keys "
            "missing); the file is incomplete or not a Wan 2.1 VAE"
        )
    vae.load_state_dict(mapped, strict=True, assign=True)
    return vae.to(device=device, dtype=dtype).eval().requires_grad_(False)


# ---- random weights at the real shapes (vLLM's "dummy" load format) --------------------------


def random_tensor(name: str, shape: tuple[int, ...], seed: int) -> Tensor:
    """A deterministic random value for checkpoint key `name`, scaled for its role: norm
    gains around 1, small biases, convolution weights with unit output variance. No zeros
    and no ones, so a path the weights do not reach cannot hide."""
    gen = torch.Generator().manual_seed(seed * 2**32 + zlib.crc32(name.encode()))
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("gamma"):
        return 1.0 + 0.2 * x
    if name.endswith("bias"):
        return 0.1 * x
    fan_in = max(1, x[0].numel())
    return x / fan_in**0.5


def random_checkpoint(config: WanVAEConfig = WAN21_VAE, seed: int = 0) -> dict[str, Tensor]:
    """A state dict in the published layout with random weights at this config's shapes."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in WanVAE(config).state_dict().items()}
    return {
        name: random_tensor(name, tuple(shapes[ours]), seed)
        for name, ours in checkpoint_layout(config).items()
    }
