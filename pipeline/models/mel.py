"""Log-mel features of 16 kHz mono audio: 25 ms window, 10 ms hop, four mel frames per 25 fps
video frame. Shared by the audio front ends of the diffusion stack
(`pipeline.diffusion.audio_encoder`) and the photo stack (`pipeline.photo.motion`).

Legend: B batch, S samples, M mel bins, F mel frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.clock import MODEL_RATE

HOP = 160
WINDOW = 400


def mel_filterbank(n_mels: int, n_fft: int = WINDOW, sr: int = MODEL_RATE) -> Tensor:
    """Triangular filters on the HTK mel scale, (n_fft // 2 + 1, n_mels)."""
    to_mel = lambda f: 2595.0 * math.log10(1.0 + f / 700.0)  # noqa: E731
    mel_points = torch.linspace(to_mel(0.0), to_mel(sr / 2), n_mels + 2)
    hz = 700.0 * (10 ** (mel_points / 2595.0) - 1.0)
    bins = torch.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (bins[None] - lo) / (mid - lo)
    down = (hi - bins[None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0).T.contiguous()


def log_mel(samples_BS: Tensor, window: Tensor, mel_fb: Tensor) -> Tensor:
    """(B, S) with S a multiple of 640 → (B, M, S / 160) log-mel, centred on each hop."""
    pad = (WINDOW - HOP) // 2
    x = F.pad(samples_BS.float(), (pad, pad))
    spec = (
        torch.stft(
            x, n_fft=WINDOW, hop_length=HOP, window=window, center=False, return_complex=True
        )
        .abs()
        .pow(2)
    )
    mel = torch.einsum("bkf,km->bmf", spec, mel_fb)
    return (torch.log10(mel.clamp_min(1e-8)) + 4.0) / 4.0
