"""A session's engine part: the generation worker thread, the frames it queues, its counts.

Audio comes in through `EngineFeed.push`; the worker (`realtime.generation`) turns it into
frames on the `FrameQueue` the video track reads; the first frames start the playout clock;
an interrupt re-times what the engine still holds; an error in the thread ends the session.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import numpy as np

from pipeline.clock import FPS
from pipeline.stream import AvatarStream
from realtime.buffers import FrameQueue
from realtime.control import Interrupt
from realtime.generation import ChunkStats, GenerationWorker
from realtime.metrics import RealtimeMetrics
from realtime.playout import PlayoutControl

log = logging.getLogger(__name__)


class EngineFeed:
    """A session's engine part: the worker thread, the frames it queues and their counts.

    Audio comes in through `push`; frames leave through the `FrameQueue` the video track
    reads. The first frames start the playout clock (`PlayoutControl.start`). An error in
    the thread ends the session through `fail`.
    """

    def __init__(
        self,
        session_id: str,
        open_engine_stream: Callable[[], AvatarStream],
        frames: FrameQueue,
        playout: PlayoutControl,
        metrics: RealtimeMetrics,
        fail: Callable[[BaseException], None],
        margin_s: float,
        engine_lock: threading.Lock | None = None,
    ) -> None:
        timing = playout.timing
        self._sid = session_id
        self._step_frames = playout.steady_step.frames
        self.frames = frames
        self._playout = playout
        self._metrics = metrics
        self._fail = fail
        self.generated = 0  # frames made
        self.first_step_s: float | None = None  # wall time of the engine's first step
        self.first_frames_s: float | None = None  # from that step's start to its first frames
        self.worker = GenerationWorker(
            open_engine_stream,
            frames,
            playout.clock,
            asyncio.get_running_loop(),
            self._on_chunk,
            self._on_error,
            session_id,
            step=playout.steady_step,
            # planned for more calls than there are, its steps are shorter until they come:
            # estimated at the planned step, it skipped frames it would have made in time
            # (an agent alone on a Pro server planned for two lost 4 of 93 on the H200)
            step_seconds=timing.steady_now or timing.steady_seconds,
            margin_s=margin_s + timing.spread * timing.steady_seconds,
            engine_lock=engine_lock,
            on_first_frames=self._on_first_frames,
        )

    def start(self) -> None:
        self.worker.start()

    def push(self, pcm16: np.ndarray) -> None:
        self.worker.push(pcm16)

    @property
    def step_seconds(self) -> float:
        return self.worker.step_seconds

    def _on_first_frames(self, seconds: float) -> None:
        """The first frames exist: the playout clock starts (the rest of the step may still
        be on its way; the plan counted on that)."""
        self.first_frames_s = seconds
        if self._playout.clock.t0 is None:
            self._playout.start()

    def _on_chunk(self, stats: ChunkStats) -> None:
        if self.first_step_s is None:
            self.first_step_s = stats.seconds
        if self._playout.clock.t0 is None:
            self._playout.start()
        duration = stats.frames / FPS
        self.generated += stats.frames
        self._metrics.frames_generated.inc(stats.frames)
        self._metrics.chunk_generation.observe(stats.seconds)
        self._metrics.chunk_duration.observe(duration)
        self._metrics.realtime_factor.observe(stats.seconds / duration)
        if stats.skipped:
            self._metrics.frames_skipped.inc(stats.skipped)

    def _on_error(self, exc: BaseException) -> None:
        self._fail(exc)

    def interrupt(self, cut: Interrupt) -> None:
        """Frames from one chunk past the frame due now are dropped (at most `cut.tail` of
        the flushed speech is still shown); the engine's next frames are shown from the cut,
        and new audio starts right after the audio the engine already holds."""
        cut.cut = max(cut.now, min(cut.now + cut.tail, self.worker.next_index()))
        self.frames.truncate(cut.cut)
        cut.new_audio = self.worker.rebase(cut.cut)

    def stop(self) -> None:
        """Tell the thread to stop after its step (it may be inside `generate_ready()`)."""
        self.worker.stop()

    async def close(self) -> None:
        """Wait for the thread to end, then drop the callbacks into this part's owner."""
        self.worker.stop()
        if not await self.worker.wait_exited(30.0):
            log.error("session %s: generation thread did not stop", self._sid)
        self.worker.release()
        self._fail = lambda exc: None

    def stats(self) -> dict:
        step = self.worker.step_seconds
        engine_fps = None if step <= 0 else round(self._step_frames / step, 1)
        return {
            # the frames a second the engine makes (a steady step's over its measured time);
            # below the clock's rate it shows that many fresh frames a second, each in sync
            "engine_fps": engine_fps,
            "below_real_time": engine_fps is not None and engine_fps < FPS,
            "frames_generated": self.generated,
            "frames_skipped": self.worker.skipped_frames_total,
            "frames_queued": self.frames.depth(),  # made, not yet due
        }
