"""Audio encoder: 16 kHz mono samples → one feature vector per 25 fps video frame.

log-mel (25 ms window, 10 ms hop: four mel frames per video frame) → two stride-2 temporal
convolutions (100 Hz → 25 Hz) → a small transformer encoder → linear projection. Video
frame n is aligned with samples [n, n + 1) × MODEL_SAMPLES_PER_FRAME (pipeline/clock.py).

The log-mel front end is `pipeline.models.mel` (the photo stack's too).

Legend: B batch, S samples, T video frames, D dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.diffusion.config import AudioEncoderConfig
from pipeline.models.mel import WINDOW, log_mel, mel_filterbank


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
