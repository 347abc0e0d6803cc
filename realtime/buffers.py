"""What the parts of a session share: two buffers and the clock that drains them.

    PlaybackTimeline   audio in ──48 kHz samples──▶ the audio track (and the interrupt's cut)
    FrameQueue         the engine feed's thread ──frames by timeline index──▶ the video track
    PlayoutClock       t0, set once by playout; both tracks pace from it, the engine feed
                       reads the frame due now

Each part is given the ones it uses (`realtime.session`); none of them knows a part.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from pipeline.clock import FPS, OUTPUT_RATE


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


class FrameQueue:
    """Generated frames by engine index, shared by the worker thread and the video track.

    The worker waits in `wait_room` until fewer than `lead` frames are queued ahead of
    playout; the video track takes frames without ever blocking the event loop.
    """

    def __init__(self, lead_frames: int, capacity: int) -> None:
        self.lead = lead_frames
        self._frames: deque[tuple[int, np.ndarray]] = deque()
        self._capacity = capacity
        self._cond = threading.Condition()
        self.dropped = 0

    def put(self, indices: list[int], frames: np.ndarray) -> None:
        """Queue frames at their (increasing) timeline indices."""
        with self._cond:
            for index, frame in zip(indices, frames, strict=True):
                self._frames.append((index, frame))
            while len(self._frames) > self._capacity:  # cannot happen while lead holds
                self._frames.popleft()
                self.dropped += 1

    def take(self, index: int) -> tuple[np.ndarray | None, int]:
        """Frame `index` if queued (else None) and how many older frames were dropped."""
        dropped = 0
        with self._cond:
            while self._frames and self._frames[0][0] < index:
                self._frames.popleft()
                dropped += 1
            frame = None
            if self._frames and self._frames[0][0] == index:
                frame = self._frames.popleft()[1]
            self._cond.notify_all()
        return frame, dropped

    def truncate(self, index: int) -> int:
        """Drop queued frames at or after `index` (interrupt); returns how many."""
        with self._cond:
            keep = [item for item in self._frames if item[0] < index]
            dropped = len(self._frames) - len(keep)
            self._frames = deque(keep)
            self._cond.notify_all()
        return dropped

    def depth(self) -> int:
        return len(self._frames)

    def wait_room(self, play_index: Callable[[], int], stop: threading.Event) -> bool:
        """Block (worker thread) until fewer than `lead` frames wait; False when stopping."""
        with self._cond:
            while not stop.is_set():
                ahead = len(self._frames) and self._frames[-1][0] + 1 - play_index()
                if ahead < self.lead:
                    return True
                self._cond.wait(timeout=0.1)  # playout advances with time, not only takes
        return False

    def wait_idle(self, stop: threading.Event, timeout: float) -> None:
        """Sleep (worker thread) until `wake()` or `timeout`: new audio or playout moved."""
        with self._cond:
            if not stop.is_set():
                self._cond.wait(timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class PlayoutClock:
    """The one clock both tracks pace from: t0 on `time.monotonic()`, set once."""

    def __init__(self) -> None:
        self._started = asyncio.Event()
        self.t0: float | None = None

    def start(self, t0: float) -> None:
        if self.t0 is None:
            self.t0 = t0
            self._started.set()

    async def wait_started(self) -> float:
        await self._started.wait()
        assert self.t0 is not None
        return self.t0

    def frame_now(self) -> int:
        """Index of the video frame due now (0 before start); safe from any thread."""
        t0 = self.t0
        return 0 if t0 is None else max(0, int((time.monotonic() - t0) * FPS))
