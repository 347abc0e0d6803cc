"""Colour correction against the reference, per frame, in CIE Lab.

Each generated frame's L, a and b channels are moved to the reference image's mean and
standard deviation (over the frame's pixels), then blended with the frame by `strength`.
It is what keeps a long FlashHead session from drifting in colour: the motion frames that
seed every chunk are taken after it. The release computes it in the video's dtype (bf16 on
a GPU), clips normalised XYZ to the white point before the Lab curve, and so do we, so that
the outputs match its code.

Legend: B batch, T frames, H, W pixels; tensors channel-last (…, 3) inside.
"""

from __future__ import annotations

import torch
from torch import Tensor

# sRGB (D65) ↔ CIE XYZ, and the D65 white point: the standard's constants
_RGB_TO_XYZ = (
    (0.4124564, 0.3575761, 0.1804375),
    (0.2126729, 0.7151522, 0.0721750),
    (0.0193339, 0.1191920, 0.9503041),
)
_XYZ_TO_RGB = (
    (3.2404542, -1.5371385, -0.4985314),
    (-0.9692660, 1.8760108, 0.0415560),
    (0.0556434, -0.2040259, 1.0572252),
)
_WHITE = (0.95047, 1.0, 1.08883)
_EPSILON = 0.008856  # CIE's (6/29)^3, as the release rounds it
_KAPPA = 903.3


_CONSTANTS: dict[tuple, Tensor] = {}


def _matrix(rows: tuple, like: Tensor) -> Tensor:
    """The constant on `like`'s device and dtype, made once: `torch.tensor` onto a GPU is a
    copy from the host that waits for the GPU's queue, four a call, every decode pass."""
    key = (rows, like.dtype, like.device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(rows, dtype=like.dtype, device=like.device)
    return _CONSTANTS[key]


def srgb_to_lab(rgb: Tensor) -> Tensor:
    """(…, 3) sRGB in [0, 1] → (…, 3) Lab."""
    linear = torch.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    xyz = linear @ _matrix(_RGB_TO_XYZ, rgb).T
    xyz = (xyz / _matrix(_WHITE, rgb)).clamp(1e-8, 1.0)
    f = torch.where(xyz > _EPSILON, xyz ** (1 / 3), (_KAPPA * xyz + 16) / 116)
    fx, fy, fz = f.unbind(-1)
    return torch.stack([116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)], dim=-1)


def lab_to_srgb(lab: Tensor) -> Tensor:
    """(…, 3) Lab → (…, 3) sRGB clipped to [0, 1]."""
    L, a, b = lab.unbind(-1)
    fy = (L + 16) / 116
    fx, fz = a / 500 + fy, fy - b / 200
    x = torch.where(fx**3 > _EPSILON, fx**3, (116 * fx - 16) / _KAPPA)
    y = torch.where(L > _KAPPA * _EPSILON, fy**3, L / _KAPPA)
    z = torch.where(fz**3 > _EPSILON, fz**3, (116 * fz - 16) / _KAPPA)
    xyz = torch.stack([x, y, z], dim=-1) * _matrix(_WHITE, lab)
    linear = xyz @ _matrix(_XYZ_TO_RGB, lab).T
    rgb = torch.where(linear > 0.0031308, 1.055 * linear ** (1 / 2.4) - 0.055, 12.92 * linear)
    return rgb.clamp(0.0, 1.0)


def lab_stats(frames_BTHW3: Tensor) -> tuple[Tensor, Tensor]:
    """Per-frame mean and population std of Lab over the pixels: (B, T, 1, 1, 3) each."""
    return frames_BTHW3.mean(dim=(2, 3), keepdim=True), frames_BTHW3.std(
        dim=(2, 3), keepdim=True, unbiased=False
    )


class ColorMatch:
    """The reference's Lab statistics, computed once per session; `__call__` corrects a
    chunk (B, 3, T, H, W) in [-1, 1] and returns it in the same layout and range."""

    def __init__(self, reference_B3HW: Tensor, strength: float) -> None:
        ref = ((reference_B3HW + 1.0) / 2.0).permute(0, 2, 3, 1)[:, None]  # (B, 1, H, W, 3)
        self.mean, self.std = lab_stats(srgb_to_lab(ref))
        self.strength = strength

    def __call__(self, video_B3THW: Tensor) -> Tensor:
        if self.strength <= 0.0:
            return video_B3THW
        return match_colors(video_B3THW, self.mean, self.std, self.strength)


def match_colors(video_B3THW: Tensor, mean_B: Tensor, std_B: Tensor, strength: float) -> Tensor:
    """Frames (B, 3, T, H, W) in [-1, 1] moved to each batch row's reference statistics
    (`ColorMatch.mean` and `.std`, stacked to (B, 1, 1, 1, 3)); a batch of streams' frames
    at once (`torch.compile` fuses its ~40 elementwise steps on a GPU)."""
    src = ((video_B3THW + 1.0) / 2.0).permute(0, 2, 3, 4, 1)  # (B, T, H, W, 3)
    lab = srgb_to_lab(src)
    mean, std = lab_stats(lab)
    std = torch.where(std < 1e-8, torch.ones_like(std), std)
    moved = lab_to_srgb((lab - mean) * (std_B.to(lab.dtype) / std) + mean_B.to(lab.dtype))
    out = (1 - strength) * src + strength * moved
    return (out.permute(0, 4, 1, 2, 3) * 2.0 - 1.0).contiguous()
