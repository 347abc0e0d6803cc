"""Audio → mouth motion: a small causal network, streamed chunk by chunk.

The synthetic face world's mouth (`pipeline.synth.motion.mouth_track_from_audio`) is the
ground truth: jaw opening, lip spread, rounding and teeth per video frame. It is computed
from a whole clip (zero-phase smoothing, the clip's own loudness as reference), so it cannot
run live; this model learns it causally, reading at most `lookahead_frames` ahead
(`pipeline/photo/train.py` trains it; the weights ship in `pipeline/assets/weights/photo`).

Input: log-mel at 100 Hz (the audio encoder's front end), four hops per video frame,
stacked → per-frame vectors; a stack of causal dilated convolutions (left padding only);
output frame n is read at position n + lookahead, so it has heard `lookahead_frames` of
audio past its own end. A chunk's frames are computed from the chunk's audio window
(`context_frames` before it, `lookahead_frames` after) alone, so any split of the audio
into pushes gives the same frames.

Legend: B batch, S samples, M mel bins, F mel hops, T video frames, C channels, P params.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import PhotoConfig
from pipeline.models.mel import HOP, WINDOW, log_mel, mel_filterbank

MOUTH_PARAMS = ("jaw", "width", "rounding", "teeth")
HOPS_PER_FRAME = MODEL_SAMPLES_PER_FRAME // HOP


class CausalBlock(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.pad = 2 * dilation
        self.conv = nn.Conv1d(channels, 2 * channels, 3, dilation=dilation)
        self.proj = nn.Conv1d(channels, channels, 1)

    def forward(self, x_BCT: Tensor) -> Tensor:
        a, b = self.conv(F.pad(x_BCT, (self.pad, 0))).chunk(2, dim=1)
        return x_BCT + self.proj(torch.tanh(a) * torch.sigmoid(b))  # gated residual


class MotionNet(nn.Module):
    """(B, S) audio → (B, T, 4) jaw 0..1, width -1..1, rounding 0..1, teeth 0..1."""

    mel_fb: Tensor  # (n_mels, bins) buffers, registered below
    window: Tensor

    def __init__(self, cfg: PhotoConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("mel_fb", mel_filterbank(cfg.n_mels), persistent=False)
        self.register_buffer("window", torch.hann_window(WINDOW), persistent=False)
        C = cfg.hidden
        self.inp = nn.Conv1d(cfg.n_mels * HOPS_PER_FRAME + 1, C, 1)
        self.blocks = nn.ModuleList(CausalBlock(C, d) for d in cfg.dilations)
        self.out = nn.Conv1d(C, len(MOUTH_PARAMS), 1)

    def receptive_frames(self) -> int:
        return 1 + sum(2 * d for d in self.cfg.dilations)

    def features(self, samples_BS: Tensor) -> Tensor:
        """(B, S), S = T frames of audio → (B, M * 4 + 1, T): four log-mel hops per frame, and the
        frame's loudness."""
        mel_BMF = log_mel(samples_BS, self.window, self.mel_fb)
        B, M, Fh = mel_BMF.shape
        T = Fh // HOPS_PER_FRAME
        x = mel_BMF[:, :, : T * HOPS_PER_FRAME].reshape(B, M, T, HOPS_PER_FRAME)
        x = x.permute(0, 1, 3, 2).reshape(B, M * HOPS_PER_FRAME, T)
        level = x.amax(dim=1, keepdim=True)
        return torch.cat([x, level], dim=1)

    def forward(self, samples_BS: Tensor) -> Tensor:
        """Per-frame params for every frame of `samples_BS`, each from the audio up to
        `lookahead_frames` past it (the last frames have heard less, see `run_window`)."""
        h = self.inp(self.features(samples_BS))
        for block in self.blocks:
            h = block(F.gelu(h))
        raw = self.out(F.gelu(h)).transpose(1, 2)  # (B, T, 4)
        jaw, width, rounding, teeth = raw.unbind(-1)
        return torch.stack(
            [torch.sigmoid(jaw), torch.tanh(width), torch.sigmoid(rounding), torch.sigmoid(teeth)],
            dim=-1,
        )

    def run_window(self, samples_BS: Tensor, n_frames: int) -> Tensor:
        """A chunk: `samples_BS` covers [start - context, start + n + lookahead) frames;
        returns (B, n, 4) for frames [start, start + n)."""
        out = self.forward(samples_BS)
        first = self.cfg.context_frames + self.cfg.lookahead_frames
        return out[:, first : first + n_frames]


def window_frames(cfg: PhotoConfig, start: int, n_frames: int) -> tuple[int, int]:
    """Absolute sample range a chunk of frames [start, start + n) reads."""
    lo = (start - cfg.context_frames) * MODEL_SAMPLES_PER_FRAME
    hi = (start + n_frames + cfg.lookahead_frames) * MODEL_SAMPLES_PER_FRAME
    return lo, hi
