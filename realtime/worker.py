"""The engine side of a session: one worker thread feeding audio and collecting frames.

`generate_ready()` is heavy and blocking, so it never runs on the event loop. The event
loop appends 16 kHz audio with `push`; the thread pushes it into the engine session a block
at a time, no further than `push_ahead` beyond playout, generates while fewer than `lead`
frames wait in the `FrameQueue`, and reports batches and failures back through loop
callbacks. An engine slower than real time skips audio it can no longer turn into frames
before their deadline, so video stays live and in sync (choppier) instead of freezing.
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
# Audio beyond a frame that engines read before emitting it (lookahead, seam context);
# generous, since it only bounds how much fresh audio is never skipped.
LOOKAHEAD_FRAMES = 8
log = logging.getLogger(__name__)


@dataclass
class ChunkStats:
    frames: int
    seconds: float  # wall time of the generate_ready() call
    skipped: int  # frames of audio skipped (generation was late) since the last report


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
        block_frames: int = 12,
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
        self._block = block_frames
        self._engine_lock = engine_lock or threading.Lock()
        self._pending: deque[np.ndarray] = deque()
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self.pushed = 0  # 16 kHz samples handed to the engine
        self.skipped = 0  # 16 kHz samples skipped because generation was late
        self.skipped_frames_total = 0
        self._unreported_skips = 0
        self._gen_seconds = 0.0  # moving average of one generate_ready() call
        self._breaks: list[tuple[int, int]] = []
        self._pad = 0  # zeros to push before the next audio (completes a frame at rebase)  # (engine sample, frames skipped before it)
        self.generated = 0  # frames produced
        self._thread = threading.Thread(target=self._run, name=f"gen-{session_id[:8]}")
        self.exited = threading.Event()
        self._exited_async: asyncio.Future[None] = loop.create_future()

    def start(self) -> None:
        self._thread.start()

    def push(self, pcm16: np.ndarray) -> None:
        """Queue 16 kHz float32 audio (event loop side; never blocks)."""
        if pcm16.size:
            with self._pending_lock:
                self._pending.append(pcm16)
            self._frames.wake()

    def next_index(self) -> int:
        """Timeline index the engine's next frame will be shown at."""
        return self._timeline_index(self.generated)

    def rebase(self, cut_frame: int) -> int:
        """Interrupt: drop audio not yet given to the engine; the engine's next frames are
        shown from `cut_frame` on. The audio it already holds (flushed speech) still becomes
        frames, shown muted; returns the timeline frame where new audio starts, right after
        them, so new speech and its frames stay in sync."""
        spf = SAMPLES_PER_FRAME_16K
        with self._pending_lock:
            self._pending.clear()
            first_new = -(-self.pushed // spf)  # engine frame that new audio starts
            self._pad += first_new * spf - self.pushed  # complete the partial frame
            self.pushed = first_new * spf
            self._breaks.append((self.generated * spf, cut_frame - self.generated))
            self.skipped = (cut_frame - self.generated) * spf
            return cut_frame + first_new - self.generated

    def stop(self) -> None:
        self._stop.set()
        self._frames.wake()

    async def wait_exited(self, timeout: float) -> bool:
        """Wait (on the loop, holding no pool thread) until the thread has finished."""
        if self._thread.ident is None:  # never started (the offer was refused)
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._exited_async), timeout)
        except asyncio.TimeoutError:
            return False
        return True

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
            self._call_soon(self._mark_exited)

    def _mark_exited(self) -> None:
        if not self._exited_async.done():
            self._exited_async.set_result(None)

    @property
    def timeline_pos(self) -> int:
        """16 kHz timeline position of the next sample to give the engine."""
        return self.pushed + self.skipped

    def _feed(self) -> bool:
        """Move up to one block of pending audio into the engine, within `push_ahead`."""
        now = self._clock.frame_now()
        with self._pending_lock:
            self._skip_late(now)
            limit = min(
                (now + self._push_ahead) * SAMPLES_PER_FRAME_16K,
                self.timeline_pos + self._block * SAMPLES_PER_FRAME_16K,
            )
            parts = self._take(limit - self.timeline_pos)
            size = sum(p.size for p in parts)
            self.pushed += size  # under the lock, so rebase sees a consistent split
            if self._pad:  # zeros that rebase already counted in `pushed` go in first
                parts.insert(0, np.zeros(self._pad, np.float32))
                self._pad = 0
        if not parts:
            return False
        self._engine.push_audio(np.concatenate(parts))
        return True

    def _take(self, room: int) -> list[np.ndarray]:
        parts, size = [], 0
        while self._pending and size < room:
            part = self._pending.popleft()
            if size + part.size > room:
                part, rest = part[: room - size], part[room - size :]
                self._pending.appendleft(rest)
            parts.append(part)
            size += part.size
        return parts

    def _skip_late(self, now: int) -> None:
        """Generation fell behind playout: skip the oldest pending audio, whole frames, that
        could no longer become frames before their deadline. The engine then works on frames
        that can still be shown; sync is kept (later frames are placed at their timeline
        index; the skipped deadlines repeat a frame). The freshest block (plus the engine's
        lookahead) always stays, so a worker that keeps up never skips."""
        if self._clock.t0 is None:
            return
        needed = now + self._needed_ahead()
        behind = needed * SAMPLES_PER_FRAME_16K - self.timeline_pos
        keep = (self._block + LOOKAHEAD_FRAMES) * SAMPLES_PER_FRAME_16K
        spare = sum(p.size for p in self._pending) - keep
        skip = min(behind, spare) // SAMPLES_PER_FRAME_16K * SAMPLES_PER_FRAME_16K
        if skip <= 0:
            return
        self._take(skip)
        self.skipped += skip
        self.skipped_frames_total += skip // SAMPLES_PER_FRAME_16K
        self._unreported_skips += skip // SAMPLES_PER_FRAME_16K
        self._breaks.append((self.pushed, self.skipped // SAMPLES_PER_FRAME_16K))

    def _needed_ahead(self) -> int:
        """Frames the engine's input must lead playout by for its output to be on time:
        1.5x the recent generation time of a block, plus two frames of slack."""
        return int(1.5 * self._gen_seconds * 25) + 2

    def _timeline_index(self, engine_frame: int) -> int:
        """Engine frame → timeline frame (they differ by the frames skipped before it)."""
        centre = engine_frame * SAMPLES_PER_FRAME_16K + SAMPLES_PER_FRAME_16K // 2
        offset = 0
        for pos, frames in self._breaks:
            if pos <= centre:
                offset = frames
        return engine_frame + offset

    def _generate(self) -> None:
        t = time.perf_counter()
        with self._engine_lock:
            batches = self._engine.generate_ready()
        seconds = time.perf_counter() - t
        self._gen_seconds = 0.7 * self._gen_seconds + 0.3 * seconds
        count = 0
        for batch in batches:
            frames = np.asarray(batch.frames)
            start = int(batch.start)
            if start != self.generated:
                log.warning(
                    "session %s: batch starts at %d, expected %d", self._sid, start, self.generated
                )
            indices = [self._timeline_index(start + i) for i in range(len(frames))]
            self._frames.put(indices, frames)
            self.generated = start + len(frames)
            count += len(frames)
        # Breaks before the last generated frame are folded into one.
        while len(self._breaks) > 1 and self._breaks[1][0] <= self.generated * 640:
            self._breaks.pop(0)
        if count:
            skipped, self._unreported_skips = self._unreported_skips, 0
            self._call_soon(self._on_chunk, ChunkStats(count, seconds, skipped))

    def _call_soon(self, fn: Callable, *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed (process exiting): nobody is listening
            pass
