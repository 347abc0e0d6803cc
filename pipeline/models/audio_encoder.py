"""Audio encoder: 16 kHz mono samples → one feature vector per 25 fps video frame.

log-mel (25 ms window, 10 ms hop: four mel frames per video frame) → two stride-2 temporal
convolutions (100 Hz → 25 Hz) → a small transformer encoder → linear projection. Video
frame n is aligned with samples [n, n + 1) × MODEL_SAMPLES_PER_FRAME (pipeline/clock.py).

Legend: B batch, S samples, M mel bins, F mel frames, T video frames, D dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.clock import MODEL_RATE
from pipeline.config import AudioEncoderConfig

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


class AudioEncoder(nn.Module):
    mel_fb: Tensor  # (n_mels, bins) buffers, registered below
    window: Tensor

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("mel_fb", mel_filterbank(cfg.n_mels), persistent=False)
        self.register_buffer("window", torch.hann_window(WINDOW), persistent=False)
        D = cfg.dim
        self.conv = nn.Sequential(
            nn.Conv1d(cfg.n_mels, D, 3, padding=1),
            nn.GELU(),
            nn.Conv1d(D, D, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv1d(D, D, 3, stride=2, padding=1),
            nn.GELU(),
        )
        self.pos = nn.Conv1d(D, D, 5, padding=2, groups=D)  # relative position by depthwise conv
        layer = nn.TransformerEncoderLayer(
            D, cfg.heads, 4 * D, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.transformer = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.out = nn.Linear(D, cfg.out_dim)

    def log_mel(self, samples_BS: Tensor) -> Tensor:
        return log_mel(samples_BS, self.window, self.mel_fb)

    def forward(self, samples_BS: Tensor) -> Tensor:
        """(B, S) samples, S = MODEL_SAMPLES_PER_FRAME T → (B, T, out_dim) features."""
        mel = self.log_mel(samples_BS).to(self.out.weight.dtype)
        x = self.conv(mel)
        x = (x + self.pos(x)).transpose(1, 2)
        return self.out(self.transformer(x))
