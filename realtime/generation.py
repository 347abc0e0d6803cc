"""The engine side of a session: one worker thread feeding audio and collecting frames.

`generate_ready()` is heavy and blocking, so it never runs on the event loop. The event
loop appends 16 kHz audio with `push`; the thread waits until the engine's next step has
all the audio it needs (`samples_needed()`), hands it exactly that (and, from a backlog,
the step after's to a stream that starts it early: `samples_wanted`), generates while fewer
than `lead` frames wait in the `FrameQueue`, and reports batches and failures back through
loop callbacks. The session's part around it is `realtime.engine_feed.EngineFeed`.

Feeding one step at a time keeps the audio the engine holds to what it must, so at each
step boundary the worker can still decide where the next frames land on the timeline. An
engine slower than real time builds a backlog of audio; the worker then skips the oldest
of it, whole frames, so that the frames this step and the next make from it are due after
they will exist (`_skip_for_slack`). Every frame the engine makes is then shown, in sync,
and the viewer sees the engine's own rate of fresh frames instead of a cascade of late ones.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.clock import FPS, MODEL_SAMPLES_PER_FRAME
from pipeline.schedule import StreamStep
from pipeline.stream import (
    AvatarStream,
    FrameBatch,
    ready_pieces,
    samples_wanted,
    steps_to_frames,
)
from realtime.buffers import FrameQueue, PlayoutClock

log = logging.getLogger(__name__)


def _ignore(*args: object) -> None:
    pass


@dataclass
class ChunkStats:
    frames: int
    seconds: float  # wall time of the generate_ready() call
    skipped: int  # frames of audio skipped (generation was late) since the last report


class GenerationWorker:
    def __init__(
        self,
        open_engine_stream: Callable[[], AvatarStream],
        frames: FrameQueue,
        clock: PlayoutClock,
        loop: asyncio.AbstractEventLoop,
        on_chunk: Callable[[ChunkStats], None],
        on_error: Callable[[BaseException], None],
        session_id: str,
        step: StreamStep,
        step_seconds: float = 0.0,
        margin_s: float = 0.1,
        engine_lock: threading.Lock | None = None,
        on_first_frames: Callable[[float], None] = _ignore,
    ) -> None:
        """`on_first_frames(seconds)`: the stream's first frames are queued, `seconds` after
        its first step began (before the step ends, where the engine makes them in pieces)."""
        self._open = open_engine_stream
        self._engine: AvatarStream | None = None
        self._frames = frames
        self._clock = clock
        self._loop = loop
        self._on_chunk = on_chunk
        self._on_error = on_error
        self._on_first_frames = on_first_frames
        self._sid = session_id
        # A steady step emits `step.frames` frames at once; the audio it reads beyond them
        # (lookahead, the seam the next step redoes) is already in the engine when the next
        # step's skip is decided.
        self._step_frames = step.frames
        self._carry_frames = step.audio_frames - step.end_frame
        self._margin_s = margin_s
        self._engine_lock = engine_lock or threading.Lock()
        self._pending: deque[np.ndarray] = deque()
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self.pushed = 0  # 16 kHz samples handed to the engine
        self.skipped = 0  # 16 kHz samples skipped because generation was late
        self.skipped_frames_total = 0
        self._unreported_skips = 0
        self._gen_seconds = step_seconds  # planned wall time of one step, then measured
        self._measured_seconds = 0.0  # the p90 once measured (`measured_step_seconds`)
        self._recent: deque[float] = deque(maxlen=16)  # wall times of recent steps (not N_0)
        # When each frame of recent steady steps existed, as a share of its step's wall time
        # (under 1 where a step sends its frames in pieces, `ready_pieces`); the first
        # step's until a steady one is measured
        self._made_shares: deque[list[float]] = deque(maxlen=4)
        self._first_made_shares: list[float] = []
        self._breaks: list[tuple[int, int]] = []  # (engine sample, frames skipped before it)
        self._pad = 0  # zeros to push before the next audio (completes a frame at rebase)
        self._reading_ahead = False  # the last feed's audio is frames a step later than its own
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
        spf = MODEL_SAMPLES_PER_FRAME
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

    def release(self) -> None:
        """After the thread exited (or never started): drop the callbacks into the owner,
        so the owner and this worker do not keep each other alive in a reference cycle."""
        if self._thread.ident is not None and not self.exited.is_set():
            return  # still inside generate_ready(): it may report when it ends
        self._on_chunk = self._on_error = self._on_first_frames = _ignore

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
            stream = self._engine = self._open()  # the init stage (reference encoding) is heavy too
            while self._frames.wait_room(self._clock.frame_now, self._stop):
                if not self._feed(stream):
                    self._frames.wait_idle(self._stop, 0.05)  # woken by push()
                    continue
                self._generate(stream)
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
    def step_seconds(self) -> float:
        """What one generation step takes: the 90th percentile of recent steps (so a
        plan on it covers their spread), the start-up measurement until there are a few."""
        return self._gen_seconds

    @property
    def measured_step_seconds(self) -> float:
        """`step_seconds` once this session's own steps measured it, else 0. Until then it
        is the estimate the worker started from, which may be the step of every call (a
        call placed in the engine's cycle plans on less): a re-plan on it grew such a call's
        delay by a chunk at its peer's first pause."""
        return self._measured_seconds

    @property
    def timeline_pos(self) -> int:
        """16 kHz timeline position of the next sample to give the engine."""
        return self.pushed + self.skipped

    def _feed(self, stream: AvatarStream) -> bool:
        """Hand the engine exactly the audio its next step still needs, once it is all here
        (skipping backlog first if generation is late); False while it is not."""
        with self._pending_lock:
            need = max(0, stream.samples_needed() - self._pad)
            pending = sum(p.size for p in self._pending)
            if pending < need:
                return False
            # a stream that starts its next step beside this one (`samples_wanted`) gets that
            # step's audio too where the backlog holds all of it; its frames, and those of a
            # stream finishing a step started ahead, come a step later than their own. The
            # skip plans as if that audio will be handed: frames early, never late
            extra = max(0, samples_wanted(stream) - stream.samples_needed())
            later = steps_to_frames(stream) > 1
            self._skip_for_slack(pending - need, later or extra > 0)
            backlog = sum(p.size for p in self._pending) - need
            handing_ahead = 0 < extra <= backlog
            self._reading_ahead = later or handing_ahead
            parts = self._take(need + (extra if handing_ahead else 0))
            self.pushed += sum(p.size for p in parts)  # under the lock: rebase sees one split
            if self._pad:  # zeros that rebase already counted in `pushed` go in first
                parts.insert(0, np.zeros(self._pad, np.float32))
                self._pad = 0
        if parts:
            stream.push_audio(np.concatenate(parts))
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

    def frames_ahead_needed(self, reading_ahead: bool | None = None) -> float:
        """How many frame times after now new audio's first frame must be due for every
        frame made from it to exist by then (`_skip_for_slack`), G more where audio becomes
        frames a step later (`reading_ahead`; default: as at the last feed), plus the margin.
        With a step's frames all at its end that is max(G, 2G - (E - carry)); a step that
        sends its first frames in pieces has them earlier, and its later frames are due
        later, so less is needed."""
        g = self._gen_seconds * FPS  # in frame times
        if reading_ahead is None:
            reading_ahead = self._reading_ahead
        later = g if reading_ahead else 0.0
        e, carry = self._step_frames, self._carry_frames
        made = [g * share for share in self._made_share()]  # frame j exists made[j] in
        # the new audio's frames: this step's from frame `carry` on, the next step's first
        # ones `E - carry` frames after it (with no lookahead, the next step's first frame)
        this_step = max((made[carry + i] - i for i in range(e - carry)), default=g)
        next_step = max(g + made[i] - (e - carry) - i for i in range(max(carry, 1)))
        return self._margin_s * FPS + later + max(this_step, next_step)

    def _made_share(self) -> list[float]:
        """Per frame of a step, when it existed as a share of the step: the latest of recent
        steady steps; until one is measured, the first step's (its pieces come at about the
        same share, where it waited for other calls' steps as a later one will), else 1
        (the step's end)."""
        measured = self._made_shares or [self._first_made_shares]
        return [
            max((m[j] for m in measured if j < len(m)), default=1.0)
            for j in range(self._step_frames)
        ]

    def _skip_for_slack(self, surplus: int, reading_ahead: bool) -> None:
        """At a step boundary, with `surplus` samples of backlog beyond the step's need: skip
        the oldest, whole frames, until the frames made from the next audio are due after
        they will exist. That audio becomes this step's last frames and, `carry` frames of it,
        the next step's first ones, which exist one step later still; so the first new frame
        must be due `margin + max(G, 2G - (E - carry))` from now (G: step time, E: frames per
        step). A worker that keeps up has no backlog and never skips."""
        if self._clock.t0 is None or surplus < MODEL_SAMPLES_PER_FRAME:
            return
        spf = MODEL_SAMPLES_PER_FRAME
        ahead = self.frames_ahead_needed(reading_ahead)
        due_now = (time.monotonic() - self._clock.t0) * FPS
        behind = math.ceil(due_now + ahead - self.timeline_pos / spf)
        skip = min(behind, surplus // spf) * spf
        if skip <= 0:
            return
        log.debug("session %s: generation is late, skipping %d frames", self._sid, skip // spf)
        self._take(skip)
        self.skipped += skip
        self.skipped_frames_total += skip // spf
        self._unreported_skips += skip // spf
        self._breaks.append((self.pushed, self.skipped // spf))

    def _timeline_index(self, engine_frame: int) -> int:
        """Engine frame → timeline frame (they differ by the frames skipped before it)."""
        centre = engine_frame * MODEL_SAMPLES_PER_FRAME + MODEL_SAMPLES_PER_FRAME // 2
        offset = 0
        for pos, frames in self._breaks:
            if pos <= centre:
                offset = frames
        return engine_frame + offset

    def _generate(self, stream: AvatarStream) -> None:
        t = time.perf_counter()
        count = 0
        made: list[float] = []  # when each frame was queued, seconds into the step
        with self._engine_lock:
            for batch in ready_pieces(stream):  # each piece queued as soon as it exists
                if self.generated == 0 and count == 0:
                    self._call_soon(self._on_first_frames, time.perf_counter() - t)
                queued = self._queue(batch)
                made += [time.perf_counter() - t] * queued
                count += queued
        seconds = time.perf_counter() - t
        # Breaks before the last generated frame are folded into one.
        while (
            len(self._breaks) > 1 and self._breaks[1][0] <= self.generated * MODEL_SAMPLES_PER_FRAME
        ):
            self._breaks.pop(0)
        shares = [m / seconds for m in made] if count == self._step_frames else None
        if count and self.generated > count:  # not the short first step
            self._recent.append(seconds)
            if shares:  # one steady step (not several at once)
                self._made_shares.append(shares)
            if len(self._recent) >= 4:
                ranked = sorted(self._recent)
                self._gen_seconds = ranked[int(0.9 * (len(ranked) - 1))]
                self._measured_seconds = self._gen_seconds
        elif shares:
            self._first_made_shares = shares
        if count:
            skipped, self._unreported_skips = self._unreported_skips, 0
            self._call_soon(self._on_chunk, ChunkStats(count, seconds, skipped))

    def _queue(self, batch: FrameBatch) -> int:
        """Put a batch's frames on the queue at their timeline places; returns how many."""
        frames = np.asarray(batch.frames)
        start = int(batch.start)
        if start != self.generated:
            log.warning(
                "session %s: batch starts at %d, expected %d", self._sid, start, self.generated
            )
        indices = [self._timeline_index(start + i) for i in range(len(frames))]
        self._frames.put(indices, frames)
        self.generated = start + len(frames)
        return len(frames)

    def _call_soon(self, fn: Callable, *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed (process exiting): nobody is listening
            pass
