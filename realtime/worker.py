"""The engine side of a session: one worker thread feeding audio and collecting frames.

`generate_ready()` is heavy and blocking, so it never runs on the event loop. The event
loop appends 16 kHz audio with `push`; the thread pushes it into the engine session no
further than `push_ahead` beyond playout, generates while fewer than `lead` frames wait in
the `FrameQueue`, and reports batches and failures back through loop callbacks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from realtime.tracks import FrameQueue, PlayoutClock

SAMPLES_PER_FRAME_16K = 640  # video frame n ↔ 16 kHz samples [n·640, (n+1)·640)
log = logging.getLogger(__name__)


@dataclass
class ChunkStats:
    frames: int
    seconds: float  # wall time of the generate_ready() call


class GenerationWorker:
    def __init__(
        self,
        open_engine_session: Callable[[], Any],
        frames: FrameQueue,
        clock: PlayoutClock,
        loop: asyncio.AbstractEventLoop,
        on_chunk: Callable[[ChunkStats], None],
        on_error: Callable[[BaseException], None],
        session_id: str,
        push_ahead_frames: int,
        engine_lock: threading.Lock | None = None,
    ) -> None:
        self._open = open_engine_session
        self._engine: Any = None
        self._frames = frames
        self._clock = clock
        self._loop = loop
        self._on_chunk = on_chunk
        self._on_error = on_error
        self._sid = session_id
        self._push_ahead = push_ahead_frames
        self._engine_lock = engine_lock or threading.Lock()
        self._pending: deque[np.ndarray] = deque()
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self.pushed = 0  # 16 kHz samples handed to the engine
        self.generated = 0  # frames produced
        self._thread = threading.Thread(target=self._run, name=f"gen-{session_id[:8]}")
        self.exited = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def push(self, pcm16: np.ndarray) -> None:
        """Queue 16 kHz float32 audio (event loop side; never blocks)."""
        if pcm16.size:
            with self._pending_lock:
                self._pending.append(pcm16)
            self._frames.wake()

    def flush_pending(self) -> int:
        """Drop audio not yet given to the engine (interrupt); returns samples dropped."""
        with self._pending_lock:
            dropped = sum(p.size for p in self._pending)
            self._pending.clear()
        return dropped

    def stop(self) -> None:
        self._stop.set()
        self._frames.wake()

    def join(self, timeout: float) -> bool:
        """Wait for the thread (call via a thread pool from async code)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._engine = self._open()  # the init stage (reference encoding) is heavy too
            while self._frames.wait_room(self._clock.frame_now, self._stop):
                if not self._feed():
                    self._frames.wait_idle(self._stop, 0.02)
                    continue
                self._generate()
        except Exception as exc:  # the session ends with an error event, never the server
            log.exception("session %s: generation failed", self._sid)
            self._call_soon(self._on_error, exc)
        finally:
            try:
                if self._engine is not None:
                    self._engine.close()
            except Exception:
                log.exception("session %s: engine session close failed", self._sid)
            self.exited.set()

    def _feed(self) -> bool:
        """Move pending audio into the engine, up to `push_ahead` frames past playout."""
        limit = (self._clock.frame_now() + self._push_ahead) * SAMPLES_PER_FRAME_16K
        room = limit - self.pushed
        if room <= 0:
            return False
        with self._pending_lock:
            parts, size = [], 0
            while self._pending and size < room:
                part = self._pending.popleft()
                if size + part.size > room:
                    part, rest = part[: room - size], part[room - size :]
                    self._pending.appendleft(rest)
                parts.append(part)
                size += part.size
            self.pushed += size  # under the lock, so flush_pending sees a consistent split
        if not parts:
            return False
        self._engine.push_audio(np.concatenate(parts))
        return True

    def _generate(self) -> None:
        t = time.perf_counter()
        with self._engine_lock:
            batches = self._engine.generate_ready()
        seconds = time.perf_counter() - t
        count = 0
        for batch in batches:
            frames = np.asarray(batch.frames)
            if batch.start != self.generated:
                log.warning(
                    "session %s: batch starts at %d, expected %d",
                    self._sid,
                    batch.start,
                    self.generated,
                )
            self._frames.put(int(batch.start), frames)
            self.generated = int(batch.start) + len(frames)
            count += len(frames)
        if count:
            self._call_soon(self._on_chunk, ChunkStats(count, seconds))

    def _call_soon(self, fn: Callable, *args: object) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)
