"""The mirror's own timeline: gap-free video and audio, whatever the session sends.

KVS must see media without holes and timecodes that never go back, and must see data at
least every 30 s or it closes the connection. The session's frames and audio, though, may
pause (no viewer pulling tracks, a stalled engine), skip (frames dropped by the mirror's
full input buffer) or restart their counters. This module maps session frame n and audio
sample s onto mirror positions with one shared offset (so lips stay in sync), repeats the
last frame and inserts silence over short gaps and pauses (wall clock: input later than
`fill_after_s` counts as missing), drops what arrives after its slot was filled, and
re-anchors the mapping when the session jumps by more than a fragment or so.

Audio sample s at 48 kHz lines up with video frame s // (48000 / fps). Runs on the
worker thread with the encoder; nothing here touches the event loop.
"""

from __future__ import annotations

import logging

import numpy as np

from pipeline.clock import OUTPUT_RATE
from realtime.kvs.metrics import KvsStats
from realtime.kvs.mkv import MkvFragment, MkvFragmentWriter

log = logging.getLogger(__name__)


class MirrorTimeline:
    def __init__(
        self,
        writer: MkvFragmentWriter,
        stats: KvsStats,
        fill_after_s: float,
        stream: str,
    ) -> None:
        settings = writer.settings
        self._writer = writer
        self._stats = stats
        self._stream = stream
        self._fps = settings.fps
        self._channels = settings.audio_channels
        self._spf = OUTPUT_RATE // settings.fps  # audio samples per video frame
        self._fill_after_s = fill_after_s
        self._reanchor_frames = settings.fragment_frames + round(fill_after_s * settings.fps)
        self._started = False
        self._offset = 0  # mirror frame = session frame + offset, once started
        self.origin_wall: float | None = None  # monotonic time of mirror frame 0
        self._last_frame = np.zeros((settings.height, settings.width, 3), np.uint8)
        self._audio_next = 0  # next mirror sample to append

    @property
    def started(self) -> bool:
        return self._started

    # --- input -----------------------------------------------------------------------
    def video(self, frame: np.ndarray, index: int, put_at: float) -> list[MkvFragment]:
        self._start(index, put_at)
        position = index + self._offset
        gap = position - self._writer.next_frame
        if abs(gap) > self._reanchor_frames:
            self._reanchor(-gap, f"video frame {index}")
            gap = 0
        if gap < 0:
            self._stats.late_dropped += 1  # its slot already went out as a repeated frame
            return []
        fragments = self._repeat_frames(gap)
        fragments += self._writer.add_video(frame, self._writer.next_frame)
        self._last_frame = frame
        return fragments

    def audio(self, pcm: np.ndarray, sample_index: int, put_at: float) -> list[MkvFragment]:
        samples = to_planar_float(pcm, self._channels)
        self._start(sample_index // self._spf, put_at)
        position = sample_index + self._offset * self._spf
        gap = position - self._audio_next
        if abs(gap) > self._reanchor_frames * self._spf:
            frames = -(gap // self._spf)  # whole frames, so video moves by the same amount
            self._reanchor(frames, f"audio sample {sample_index}")
            gap = sample_index + self._offset * self._spf - self._audio_next
        if gap < 0:
            samples = samples[:, -gap:]  # the start overlaps audio already sent
            if samples.shape[1] == 0:
                self._stats.late_dropped += 1
                return []
            gap = 0
        fragments = self._silence(gap)
        fragments += self._writer.add_audio(samples)
        self._audio_next += samples.shape[1]
        return fragments

    def fill(self, now: float) -> list[MkvFragment]:
        """Repeat the last frame and add silence for input later than `fill_after_s`."""
        if self.origin_wall is None:
            return []
        target = int((now - self.origin_wall - self._fill_after_s) * self._fps)
        fragments = []
        if target > self._writer.next_frame:
            fragments += self._repeat_frames(target - self._writer.next_frame)
        if target * self._spf > self._audio_next:
            fragments += self._silence(target * self._spf - self._audio_next)
        return fragments

    def next_fill_at(self) -> float | None:
        """Monotonic time at which `fill` will next have something to do."""
        if self.origin_wall is None:
            return None
        behind = min(self._writer.next_frame, self._audio_next // self._spf)
        return self.origin_wall + self._fill_after_s + (behind + 1) / self._fps

    def finish(self) -> list[MkvFragment]:
        """End both tracks together, then flush the encoders."""
        fragments = []
        video_end = self._writer.next_frame * self._spf
        if self._audio_next < video_end:
            fragments += self._silence(video_end - self._audio_next)
        elif self._audio_next > video_end:
            missing = -(-(self._audio_next - video_end) // self._spf)
            fragments += self._repeat_frames(missing)
            fragments += self._silence(self._writer.next_frame * self._spf - self._audio_next)
        return fragments + self._writer.finish()

    # --- internals -------------------------------------------------------------------
    def _start(self, session_frame: int, put_at: float) -> None:
        if not self._started:
            self._started = True
            self._offset = -session_frame
            self.origin_wall = put_at

    def _reanchor(self, frames: int, what: str) -> None:
        self._offset += frames
        self._stats.reanchors += 1
        log.info(
            "KVS stream %s: %s is %d frames off the mirror timeline; re-anchoring",
            self._stream,
            what,
            -frames,
        )

    def _repeat_frames(self, count: int) -> list[MkvFragment]:
        fragments = []
        for _ in range(count):
            fragments += self._writer.add_video(self._last_frame, self._writer.next_frame)
        self._stats.filled_frames += count
        return fragments

    def _silence(self, count: int) -> list[MkvFragment]:
        if count <= 0:
            return []
        self._audio_next += count
        return self._writer.add_audio(np.zeros((self._channels, count), np.float32))


def to_planar_float(pcm: np.ndarray, channels: int) -> np.ndarray:
    """int16 PCM shaped (n,) or (n, c) with c in {1, 2} to float32 (channels, n)."""
    if pcm.ndim == 1:
        pcm = pcm[:, None]
    if pcm.ndim != 2 or pcm.shape[1] not in (1, 2):
        raise ValueError(f"audio must be shaped (n,) or (n, 1|2), got {pcm.shape}")
    samples = pcm.T.astype(np.float32) / 32768.0
    if samples.shape[0] == channels:
        return samples
    if channels == 1:
        return samples.mean(axis=0, keepdims=True)
    return np.repeat(samples, 2, axis=0)
