"""Causal video VAE: an encoder for the reference (and training), a streaming decoder.

The decoder is causal in time: every temporal convolution looks only at the current and
previous latent frames, and its look-back is passed in and out explicitly as a cache.
Decoding a latent sequence chunk by chunk, carrying the cache, gives exactly the frames of
decoding it whole. Normalisation is per frame (GroupNorm on B*T images), never over time.

Legend: B batch, C channels, T latent frames, r video frames per latent frame, H/W pixels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.diffusion.config import VAEConfig

Cache = list[Tensor | None]


class CausalConv3d(nn.Module):
    """3x3 spatial, `kt` temporal, causal: pads time on the left with the cache (or, at the
    very start of a stream, with copies of the first frame)."""

    def __init__(self, c_in: int, c_out: int, kt: int = 3) -> None:
        super().__init__()
        self.kt = kt
        self.conv = nn.Conv3d(c_in, c_out, kernel_size=(kt, 3, 3), padding=(0, 1, 1))

    def forward(self, x_BCTHW: Tensor, cache: Tensor | None) -> tuple[Tensor, Tensor]:
        if cache is None:
            cache = x_BCTHW[:, :, :1].expand(-1, -1, self.kt - 1, -1, -1)
        x = torch.cat([cache, x_BCTHW], dim=2)
        new_cache = x[:, :, -(self.kt - 1) :].detach()
        if x.device.type == "cpu":
            return self._conv_as_2d(x), new_cache
        return self.conv(x), new_cache

    def _conv_as_2d(self, x_BCTHW: Tensor) -> Tensor:
        """The same convolution as one 2D conv over each frame's kt-frame stack: PyTorch's CPU
        Conv3d is a slow fallback, its Conv2d is not. (On GPUs the stack would cost kt times
        the activation memory, so they keep cuDNN's Conv3d.)"""
        B, C, TT, H, W = x_BCTHW.shape
        T = TT - self.kt + 1
        # channels-last frames (oneDNN runs thin convs 2-3x faster so): the kt shifted frames
        # side by side on the channel axis, frame-major, built with one copy
        x_BTHWC = x_BCTHW.permute(0, 2, 3, 4, 1)
        stack = torch.cat([x_BTHWC[:, k : k + T] for k in range(self.kt)], dim=-1)
        stack = stack.reshape(B * T, H, W, self.kt * C).permute(0, 3, 1, 2)
        w = self.conv.weight.transpose(1, 2).flatten(1, 2)  # (Cout, kt*C, 3, 3), frame-major
        y = F.conv2d(
            stack, w.contiguous(memory_format=torch.channels_last), self.conv.bias, padding=1
        )
        return y.reshape(B, T, -1, H, W).transpose(1, 2)


def frame_norm(x_BCTHW: Tensor, norm: nn.GroupNorm) -> Tensor:
    B, C, T, H, W = x_BCTHW.shape
    y = norm(x_BCTHW.transpose(1, 2).reshape(B * T, C, H, W))
    return y.view(B, T, C, H, W).transpose(1, 2)


class CausalResBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(min(8, c), c), nn.GroupNorm(min(8, c), c)
        self.conv1, self.conv2 = CausalConv3d(c, c), CausalConv3d(c, c)

    def forward(self, x: Tensor, cache: Cache, i: int) -> Tensor:
        h, cache[i] = self.conv1(F.silu(frame_norm(x, self.norm1)), cache[i])
        h, cache[i + 1] = self.conv2(F.silu(frame_norm(h, self.norm2)), cache[i + 1])
        return x + h


class Encoder(nn.Module):
    """Frames → latent mean and log-variance. Each latent frame sees its own r video frames
    (stacked as channels); encoding is per latent frame, hence trivially causal."""

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.r = cfg.temporal_ratio
        chans = cfg.channels
        self.conv_in = nn.Conv2d(3 * self.r, chans[0], 3, padding=1)
        layers: list[nn.Module] = []
        for i, c in enumerate(chans):
            c_next = chans[min(i + 1, len(chans) - 1)]
            layers += [
                nn.GroupNorm(min(8, c), c),
                nn.SiLU(),
                nn.Conv2d(c, c_next, 3, stride=2, padding=1),
            ]
        self.down = nn.Sequential(*layers)
        self.conv_out = nn.Conv2d(chans[-1], 2 * cfg.latent_channels, 3, padding=1)

    def forward(self, frames_B3THW: Tensor) -> tuple[Tensor, Tensor]:
        B, _, TR, H, W = frames_B3THW.shape
        T = TR // self.r
        x = frames_B3THW.view(B, 3, T, self.r, H, W).permute(0, 2, 1, 3, 4, 5)
        x = x.reshape(B * T, 3 * self.r, H, W)
        mean, logvar = self.conv_out(self.down(self.conv_in(x))).chunk(2, dim=1)
        to_5d = lambda y: y.view(B, T, *y.shape[1:]).transpose(1, 2)  # noqa: E731
        return to_5d(mean), to_5d(logvar)


class _DecoderLevel(nn.Module):
    """One resolution of the decoder: residual blocks, then the conv after a 2x upsample.
    (Its weights are named `levels.i.blocks.j…` and `levels.i.up…`, as they always were.)"""

    def __init__(self, channels: int, channels_next: int, res_blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CausalResBlock(channels) for _ in range(res_blocks))
        self.up = nn.Conv2d(channels, channels_next, 3, padding=1)


class Decoder(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.r = cfg.temporal_ratio
        chans = list(reversed(cfg.channels))  # low-res (wide) → high-res (narrow)
        self.conv_in = CausalConv3d(cfg.latent_channels, chans[0])
        # depth-to-time: one latent frame becomes r video frames
        self.to_time = nn.Conv3d(chans[0], chans[0] * self.r, kernel_size=1)
        self.levels = nn.ModuleList(
            _DecoderLevel(c, chans[min(i + 1, len(chans) - 1)], cfg.res_blocks)
            for i, c in enumerate(chans)
        )
        self.norm_out = nn.GroupNorm(min(8, chans[-1]), chans[-1])
        self.conv_out = nn.Conv2d(chans[-1], 3, 3, padding=1)
        self.cache_size = 1 + 2 * cfg.res_blocks * len(chans)

    def forward(self, z_BCTHW: Tensor, cache: Cache | None = None) -> tuple[Tensor, Cache]:
        """Latents (B, C, T, h, w) → frames in [-1, 1], (B, 3, T*r, H, W), and the new cache."""
        cache = list(cache) if cache is not None else [None] * self.cache_size
        x, cache[0] = self.conv_in(z_BCTHW, cache[0])
        B, C, T, h, w = x.shape
        x = self.to_time(x).view(B, C, self.r, T, h, w).transpose(2, 3).reshape(B, C, -1, h, w)
        i = 1
        for level in self.levels:
            assert isinstance(level, _DecoderLevel)
            for block in level.blocks:
                x = block(x, cache, i)
                i += 2
            B, C, TT, h, w = x.shape
            y = x.transpose(1, 2).reshape(B * TT, C, h, w)
            y = level.up(F.interpolate(y, scale_factor=2, mode="nearest"))
            x = y.view(B, TT, *y.shape[1:]).transpose(1, 2)
        B, C, TT, H, W = x.shape
        y = F.silu(self.norm_out(x.transpose(1, 2).reshape(B * TT, C, H, W)))
        y = torch.tanh(self.conv_out(y))
        return y.view(B, TT, 3, H, W).transpose(1, 2), cache


class VAE(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def encode_image(self, image_B3HW: Tensor) -> Tensor:
        """A still image in [-1, 1] → one latent frame (B, C, 1, h, w) (the mean)."""
        frames = image_B3HW[:, :, None].expand(-1, -1, self.cfg.temporal_ratio, -1, -1)
        mean, _ = self.encoder(frames)
        return mean
