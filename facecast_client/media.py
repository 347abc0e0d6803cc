"""What goes into a call and what comes out of it: the microphone-like source, what was
received, and the recording of it.

    PcmSource      queued PCM sent as a microphone sends it, 20 ms a frame (at `speed`)
    Received       the video and audio that came back, with RTP pts and arrival times
    CallRecorder   the call to MP4, video placed by its RTP timestamps
"""

from __future__ import annotations

import asyncio
import fractions
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.clock import OUTPUT_RATE, OUTPUT_SAMPLES_PER_PACKET, VIDEO_TICKS_PER_FRAME
from pipeline.media import Mp4Writer, read_audio, resample, to_pcm16


def read_pcm(path: str | Path) -> np.ndarray:
    """Any audio file → what a microphone sends: mono int16 at the playout rate."""
    return to_pcm16(read_audio(path, OUTPUT_RATE))


class PcmSource(MediaStreamTrack):
    """Outgoing microphone-like audio: queued PCM, then silence, 20 ms per frame.

    `speed` 1.0 sends in real time; 2.0 sends queued audio twice as fast (an agent pushing
    TTS ahead). After the queued audio runs out it keeps sending silence in real time, like
    a muted mic, so the call stays alive; `ended_at` is when the last queued sample was sent.
    """

    kind = "audio"

    def __init__(
        self, pcm: np.ndarray | None = None, speed: float = 1.0, loop: bool = False
    ) -> None:
        super().__init__()
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.speed = speed
        # (not `_loop`: aiortc's tracks keep their event loop under that name)
        self._clip = np.asarray(pcm, np.int16).reshape(-1) if loop and pcm is not None else None
        self._buf = np.zeros(0, np.int16)
        self._sent: list[np.ndarray] = []  # everything sent, 20 ms a piece (`sent`)
        self.sent_at: list[float] = []  # when each 20 ms frame of it was sent
        self._deadline = 0.0
        self._index = 0
        self._t0: float | None = None
        self.started_at: float | None = None  # monotonic time of the first frame
        self.ended_at: float | None = None
        if pcm is not None:
            self.push(pcm)

    @classmethod
    def from_wav(cls, path: str | Path, speed: float = 1.0, loop: bool = False) -> PcmSource:
        return cls(read_pcm(path), speed, loop)

    def push(self, pcm: np.ndarray, rate: int = OUTPUT_RATE) -> None:
        """Queue mono PCM (int16, or float in [-1, 1]; NaN/clipping tolerated)."""
        pcm = np.asarray(pcm).reshape(-1)
        if rate != OUTPUT_RATE:
            pcm = resample(pcm / 32768.0 if pcm.dtype == np.int16 else pcm, rate, OUTPUT_RATE)
        if pcm.dtype != np.int16:
            pcm = to_pcm16(pcm)
        self._buf = np.concatenate([self._buf, pcm])
        self.ended_at = None

    @property
    def queued(self) -> int:
        return self._buf.size

    @property
    def sent(self) -> np.ndarray:
        """Everything sent so far, for alignment. Kept in 20-ms pieces and joined here:
        joining onto one array at every frame copied the whole call 50 times a second, which
        over a 10-minute call took the client's event loop."""
        if len(self._sent) != 1:
            self._sent = [np.concatenate(self._sent) if self._sent else np.zeros(0, np.int16)]
        return self._sent[0]

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = self.started_at = self._deadline = now
        if self._deadline > now:
            await asyncio.sleep(self._deadline - now)
        if (
            self._clip is not None and self._buf.size < OUTPUT_SAMPLES_PER_PACKET
        ):  # the clip again, seamlessly
            self._buf = np.concatenate([self._buf, self._clip])
        # queued audio goes at `speed`; the silence after it at real time, like a mic
        self._deadline += (
            OUTPUT_SAMPLES_PER_PACKET / OUTPUT_RATE / (self.speed if self._buf.size else 1.0)
        )
        self.sent_at.append(time.monotonic())
        chunk, self._buf = (
            self._buf[:OUTPUT_SAMPLES_PER_PACKET],
            self._buf[OUTPUT_SAMPLES_PER_PACKET:],
        )
        if chunk.size < OUTPUT_SAMPLES_PER_PACKET:
            if chunk.size or self.ended_at is None:
                self.ended_at = time.monotonic()
            chunk = np.concatenate(
                [chunk, np.zeros(OUTPUT_SAMPLES_PER_PACKET - chunk.size, np.int16)]
            )
        self._sent.append(chunk)
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        frame.pts = self._index * OUTPUT_SAMPLES_PER_PACKET
        frame.time_base = fractions.Fraction(1, OUTPUT_RATE)
        self._index += 1
        return frame


@dataclass
class Received:
    """What came back: video frames and audio, each with RTP-derived pts and arrival time."""

    video_pts: list[int] = field(default_factory=list)  # 90 kHz, first frame = 0
    video_arrival: list[float] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)  # kept when keep_frames
    audio_pts: list[int] = field(default_factory=list)  # 48 kHz
    audio_arrival: list[float] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)  # int16 mono per frame

    def audio_timeline(self) -> np.ndarray:
        """Received audio placed by pts (relative to the first packet), mono int16."""
        if not self.audio:
            return np.zeros(0, np.int16)
        base = self.audio_pts[0]
        end = max(p - base + a.size for p, a in zip(self.audio_pts, self.audio, strict=True))
        out = np.zeros(end, np.int16)
        for pts, pcm in zip(self.audio_pts, self.audio, strict=True):
            out[pts - base : pts - base + pcm.size] = pcm
        return out


class CallRecorder:
    """Records the call to MP4 (`pipeline.media.Mp4Writer`), video placed by its RTP
    timestamps. Thread-safe: the video and audio consumers call it from worker threads,
    and one container must not be muxed into from two threads at once. The file is opened
    at the first frame (its size); audio before it is not recorded."""

    def __init__(self, path: str | Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._writer: Mp4Writer | None = None
        self._v0 = 0

    def video(self, rgb: np.ndarray, pts: int) -> None:
        with self._lock:
            if self._writer is None:
                self._writer = Mp4Writer(self._path, rgb.shape[1], rgb.shape[0])
                self._v0 = pts
            index = round((pts - self._v0) / VIDEO_TICKS_PER_FRAME)
            self._writer.write_frames(rgb[None], start=index)

    def audio(self, pcm: np.ndarray, pts: int) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.write_audio(pcm.astype(np.float32) / 32768.0)

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
