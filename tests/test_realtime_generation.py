"""The generation worker: retiming after an interrupt, skipping stale backlog in sync."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from realtime.buffers import FrameQueue, PlayoutClock


class ScriptedEngineSession:
    """Emits 12 frames per 12 frames of audio (with 4 frames of lookahead); each frame's
    pixels hold its engine index, so tests can see which frame lands where."""

    def __init__(self) -> None:
        self.audio = 0
        self.emitted = 0
        self.closed = False

    def push_audio(self, samples):
        self.audio += len(samples)

    def samples_needed(self):
        return max(0, (self.emitted + 16) * 640 - self.audio)

    def generate_ready(self):
        from pipeline.stream import FrameBatch

        out = []
        while self.audio >= (self.emitted + 16) * 640:
            values = np.arange(self.emitted, self.emitted + 12, dtype=np.uint8)
            out.append(
                FrameBatch(
                    self.emitted, np.broadcast_to(values[:, None, None, None], (12, 4, 4, 3)).copy()
                )
            )
            self.emitted += 12
        return out

    def close(self):
        self.closed = True


def scripted_worker(engine, frames, clock):
    """A generation worker around a scripted engine, with no stats or error callbacks."""
    import threading

    from pipeline.schedule import StreamStep
    from realtime.generation import GenerationWorker

    return GenerationWorker(
        lambda: engine,
        frames,
        clock,
        asyncio.get_running_loop(),
        lambda stats: None,
        lambda exc: None,
        "unit",
        step=StreamStep(1, audio_frames=28, first_frame=12, end_frame=24),
        engine_lock=threading.Lock(),
    )


async def test_worker_rebase_retimes_frames_after_an_interrupt():
    engine = ScriptedEngineSession()
    frames, clock = FrameQueue(lead_frames=200, capacity=400), PlayoutClock()
    worker = scripted_worker(engine, frames, clock)
    worker.start()
    try:
        worker.push(np.zeros(40 * 640 + 100, np.float32))  # 40 frames and a bit
        await asyncio.sleep(0.3)
        assert worker.generated == 36 and worker.next_index() == 36
        frames.truncate(10)  # what PeerSession.interrupt does: keep 0..9
        new_audio = worker.rebase(10)
        # The engine was given exactly what its steps needed, audio up to frame 40 (the
        # partial frame still waited in the worker and is flushed): its frames 36..39 are
        # shown muted from 10 on; new audio starts at timeline frame 10 + 40 - 36 = 14.
        assert new_audio == 14 and worker.timeline_pos == 14 * 640
        worker.push(np.zeros(30 * 640, np.float32))
        await asyncio.sleep(0.3)
        queued = list(frames._frames)
        indices = [i for i, _ in queued]
        assert indices == list(range(len(indices))) and len(indices) >= 30
        shown = {i: int(f[0, 0, 0]) for i, f in queued}
        assert shown[9] == 9 and shown[10] == 36 and shown[11] == 37  # re-timed, no gap
    finally:
        worker.stop()
        assert await worker.wait_exited(5)
    assert engine.closed


async def test_worker_skips_stale_backlog_but_keeps_sync():
    engine = ScriptedEngineSession()
    frames, clock = FrameQueue(lead_frames=200, capacity=400), PlayoutClock()
    clock.start(time.monotonic() - 4.0)  # playout is already at frame 100
    worker = scripted_worker(engine, frames, clock)
    worker.push(np.zeros(130 * 640, np.float32))  # a backlog: frames 0..99 are already due
    worker.start()
    try:
        await asyncio.sleep(0.3)
    finally:
        worker.stop()
        await worker.wait_exited(5)
    queued = list(frames._frames)
    assert worker.skipped_frames_total >= 100 and queued, worker.skipped_frames_total
    offset = worker.skipped_frames_total
    for index, frame in queued:  # frame at timeline index i was made from audio frame i
        assert index >= 100 and int(frame[0, 0, 0]) == index - offset


class ReadAheadStream:
    """A stream that, like LiveAvatar's, starts block k+1 inside block k's step where block
    k+1's audio is already here; each frame's pixels hold its block, and `beside` says, per
    block, whether the next one was started in its step."""

    def __new__(cls):
        from pipeline.config import load_config
        from pipeline.windowed_stream import WindowedStream

        class Stream(WindowedStream):
            def __init__(self) -> None:
                super().__init__(load_config("liveavatar"), window=4 * 16000, sinks=[])
                self.read_ahead = 1
                self.ahead: int | None = None
                self.beside: list[bool] = []

            def audio_end(self, k: int) -> int:
                return (self.plan.n_end(k) + 2) * 640

            def started_ahead(self, k: int) -> bool:
                return self.ahead == k

            def make_chunk(self, k, chunk):
                self.ahead = k + 1 if self.has_audio_for(k + 1) else None
                self.beside.append(self.ahead is not None)
                yield np.full((chunk.length, 4, 4, 3), k, np.uint8)

            def release(self) -> None:
                self.ahead = None

        return Stream()


async def test_a_backlog_lets_a_read_ahead_stream_start_each_block_beside_the_last():
    """With audio queued beyond the next block, the worker hands the block after it too, so
    every block but the last starts in its predecessor's step; frames in order, each once."""
    stream = ReadAheadStream()
    frames, clock = FrameQueue(lead_frames=400, capacity=400), PlayoutClock()
    worker = scripted_worker(stream, frames, clock)
    worker.push(np.zeros((12 * 10 + 2) * 640, np.float32))  # ten blocks' audio, at once
    worker.start()
    try:
        await asyncio.sleep(0.5)
        # block 9's audio is here but block 10's is not: block 9 waits, started, for more
        assert stream.beside == [True] * 9 and stream.started_ahead(9)
        assert stream.samples_needed() == 12 * 640  # block 10's audio
    finally:
        worker.stop()
        await worker.wait_exited(5)
    queued = list(frames._frames)
    assert [i for i, _ in queued] == list(range(9 * 12))
    assert [int(f[0, 0, 0]) for _, f in queued] == [i // 12 for i in range(9 * 12)]


async def test_audio_in_real_time_is_made_as_it_comes_without_reading_ahead():
    """With no backlog the worker hands each block exactly its audio: no block waits for the
    next one's audio, so a feed that keeps up pays no extra block of latency."""
    stream = ReadAheadStream()
    frames, clock = FrameQueue(lead_frames=400, capacity=400), PlayoutClock()
    worker = scripted_worker(stream, frames, clock)
    worker.start()
    try:
        worker.push(np.zeros(14 * 640, np.float32))  # block 0 and its lookahead
        for k in range(1, 4):
            await asyncio.sleep(0.15)
            assert worker.generated == 12 * k  # block k-1 is out before block k's audio
            worker.push(np.zeros(12 * 640, np.float32))
        await asyncio.sleep(0.15)
        assert worker.generated == 48
    finally:
        worker.stop()
        await worker.wait_exited(5)
    assert stream.beside == [False] * 4


class PiecesEngineSession:
    """Steps of 12 frames from 12 frames of audio (no lookahead), each taking 0.2 s; with
    `pieces`, its first 4 frames leave halfway through the step, as FlashHead Pro's first
    decode pass does, else all at its end."""

    def __init__(self, pieces: bool) -> None:
        self.pieces = pieces
        self.audio = 0
        self.emitted = 0

    def push_audio(self, samples):
        self.audio += len(samples)

    def samples_needed(self):
        return max(0, (self.emitted + 12) * 640 - self.audio)

    def iter_ready(self):
        from pipeline.stream import FrameBatch

        while self.audio >= (self.emitted + 12) * 640:
            frames = np.zeros((12, 4, 4, 3), np.uint8)
            time.sleep(0.1)
            if self.pieces:
                yield FrameBatch(self.emitted, frames[:4])
            time.sleep(0.1)
            yield (
                FrameBatch(self.emitted + 4, frames[4:])
                if self.pieces
                else FrameBatch(self.emitted, frames)
            )
            self.emitted += 12

    def generate_ready(self):
        return list(self.iter_ready())

    def close(self):
        pass


async def test_a_step_whose_first_frames_leave_early_needs_less_lead_before_skipping():
    """The skip keeps new audio's frames due after they exist. A step that sends its first
    4 frames halfway has them at half a step, and its later frames are due later: new audio
    needs about half a step of lead where a step sending all at its end needs the whole
    step (skipping more would repeat frames that were in time)."""
    from pipeline.schedule import StreamStep
    from realtime.generation import GenerationWorker

    needed = {}
    for pieces in (False, True):
        engine, frames = PiecesEngineSession(pieces), FrameQueue(lead_frames=200, capacity=400)
        worker = GenerationWorker(
            lambda engine=engine: engine,
            frames,
            PlayoutClock(),  # not started: nothing is due, nothing skipped
            asyncio.get_running_loop(),
            lambda stats: None,
            lambda exc: None,
            "unit",
            step=StreamStep(1, audio_frames=24, first_frame=12, end_frame=24),
            step_seconds=0.2,
            margin_s=0.0,
        )
        worker.push(np.zeros(72 * 640, np.float32))  # six steps
        worker.start()
        try:
            for _ in range(100):  # six steps of 0.2 s, however slow the machine
                if engine.emitted == 72:
                    break
                await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await worker.wait_exited(5)
        assert engine.emitted == 72 and worker.skipped_frames_total == 0
        # its own steps measured (five after the first), not the estimate it started from
        assert worker.measured_step_seconds == worker.step_seconds > 0.19
        step = worker.step_seconds * 25  # in frame times
        needed[pieces] = worker.frames_ahead_needed(reading_ahead=False) / step
    assert needed[False] == pytest.approx(1.0, abs=0.02), needed  # all at the step's end
    assert 0.45 < needed[True] < 0.75, needed  # its first piece, halfway
