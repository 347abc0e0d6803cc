"""Incoming audio: decoded WebRTC frames → one open-ended timeline at 48 kHz and 16 kHz.

aiortc hands us Opus decoded to 48 kHz stereo s16. PyAV's `AudioResampler` (libswresample)
downmixes it to mono 48 kHz, which is kept for playout (the avatar says back what it heard),
and a second resampler derives mono 16 kHz float32 for silero-vad and the engine. Padding
silence goes through the same path, so both rates always describe the same timeline.

Positions are sample indices on the 48 kHz timeline (`pos48`); the 16 kHz stream lags it
by the resampler's filter delay, a few samples.
"""

from __future__ import annotations

import logging
from collections import deque

import av
import numpy as np

from pipeline.clock import MODEL_RATE, OUTPUT_RATE

log = logging.getLogger(__name__)


class InputResampler:
    """Decoded frames (any rate/layout/format) → mono s16 48 kHz and mono float32 16 kHz."""

    def __init__(self) -> None:
        self._to48 = av.AudioResampler(format="s16", layout="mono", rate=OUTPUT_RATE)
        self._to16 = av.AudioResampler(format="flt", layout="mono", rate=MODEL_RATE)

    def mono48(self, frame: av.AudioFrame) -> np.ndarray:
        """Downmix/resample one decoded frame; int16 (n,) at 48 kHz."""
        frame.pts = None  # our timeline is sample counts, not the peer's RTP clock
        return _concat_s16(self._to48.resample(frame))

    def to16(self, pcm48: np.ndarray) -> np.ndarray:
        """Mono int16 48 kHz → mono float32 16 kHz, finite and within [-1, 1]."""
        if pcm48.size == 0:
            return np.zeros(0, np.float32)
        frame = av.AudioFrame.from_ndarray(pcm48.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        out = [f.to_ndarray().reshape(-1) for f in self._to16.resample(frame)]
        pcm16 = np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)
        # s16 input cannot carry NaN, but a misbehaving filter must never reach the model.
        return np.clip(np.nan_to_num(pcm16, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)


def _concat_s16(frames: list[av.AudioFrame]) -> np.ndarray:
    if not frames:
        return np.zeros(0, np.int16)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)


class PlaybackTimeline:
    """The 48 kHz mono playout buffer of one session: append, read by position, mute, cut.

    Only samples at or after `base` are kept; the audio track calls `release_before` as it
    plays, so memory is bounded by how far the input runs ahead of playout.
    """

    def __init__(self, max_ahead_s: float = 120.0) -> None:
        self._chunks: deque[np.ndarray] = deque()
        self.base = 0  # position of the first kept sample
        self.head = 0  # position one past the last sample
        self._max_ahead = int(max_ahead_s * OUTPUT_RATE)
        self._muted: list[tuple[int, int]] = []

    def append(self, pcm48: np.ndarray) -> int:
        """Append samples; returns the position of the first one."""
        start = self.head
        if pcm48.size:
            self._chunks.append(pcm48.astype(np.int16, copy=False))
            self.head += pcm48.size
        return start

    def overfull(self) -> bool:
        """True when the input is further ahead of playout than the buffer allows."""
        return self.head - self.base > self._max_ahead

    def read(self, start: int, n: int) -> np.ndarray:
        """Samples [start, start+n); zeros where nothing is buffered or the span is muted."""
        out = np.zeros(n, np.int16)
        pos = self.base
        for chunk in self._chunks:
            end = pos + chunk.size
            lo, hi = max(pos, start), min(end, start + n)
            if lo < hi:
                out[lo - start : hi - start] = chunk[lo - pos : hi - pos]
            if end >= start + n:
                break
            pos = end
        for m0, m1 in self._muted:
            lo, hi = max(m0, start), min(m1, start + n)
            if lo < hi:
                out[lo - start : hi - start] = 0
        return out

    def release_before(self, pos: int) -> None:
        """Forget samples that have been played."""
        while self._chunks and self.base + self._chunks[0].size <= pos:
            self.base += self._chunks.popleft().size
        self._muted = [(a, b) for a, b in self._muted if b > pos]

    def mute(self, start: int, end: int) -> None:
        """Silence [start, end) for playout (interrupted speech is not said)."""
        if end > start:
            self._muted.append((start, end))

    def cut_at(self, pos: int) -> None:
        """Make `pos` the head: drop what follows, or pad silence up to it."""
        if pos >= self.head:
            self.append(np.zeros(pos - self.head, np.int16))
        else:
            self.truncate(pos)

    def truncate(self, pos: int) -> int:
        """Drop everything at or after `pos` (queued speech flushed); returns samples dropped."""
        pos = max(pos, self.base)
        dropped = max(0, self.head - pos)
        while self._chunks and self.head > pos:
            last = self._chunks.pop()
            keep = pos - (self.head - last.size)
            self.head -= last.size
            if keep > 0:
                self._chunks.append(last[:keep])
                self.head += keep
        return dropped
