"""The engine in a process of its own, so generation never waits for the media loop.

In one process, the engine's Python (thousands of kernel launches a step on a GPU, the
small ops of the CPU demo) takes turns on the GIL with the event loop, Opus, the resampler
and the VAD; under load, most visibly when an agent pushes audio five times faster than
real time, a step then takes up to twice its time. `EngineProcess` starts the engine in a
spawned child (`pipeline.startup.start_engine`: load, compile, warm-up) and offers what the
server's sessions use of an `Engine`: `cfg`, `stream_step`, `step_seconds`, `device`,
`new_stream`. Calls cross one pipe, each numbered and its reply matched by number, so
several sessions' calls are in flight at once; in the child each session's calls run in
order on a thread of its own, so an engine that batches its sessions' steps
(`pipeline.batching`) batches them here as in the server's process. Frames come back
through a shared-memory buffer per session, so a 720p step's 44 MB are copied once.

A failure inside the child is raised in the caller as `EngineProcessError`; the child
dying ends every session with that error, and the server with it reports `failed`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
import traceback
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import torch

from pipeline.logs import log_levels, setup_logging_as
from pipeline.schedule import ChunkPlan, StreamStep
from pipeline.startup import EngineOptions
from pipeline.stream import FrameBatch, Reference, StartupReport, ready_pieces
from pipeline.warmup import Progress

log = logging.getLogger(__name__)


class EngineProcessError(RuntimeError):
    """The engine process failed (an exception there, or the process is gone)."""


class EngineProcess:
    """A started engine in a child process; `new_stream` gives proxies of its sessions. A
    `realtime.engine_host.HostedEngine`."""

    own_process = True

    def __init__(self, options: EngineOptions, progress: Progress | None = None) -> None:
        """Blocks until the engine is warm; `progress` hears each part of its start-up."""
        ctx = mp.get_context("spawn")  # CUDA cannot be forked; a clean interpreter anyway
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve_engine,
            args=(child, options, log_levels()),  # its log lines as this process's
            name="facecast-engine",
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._lock = threading.Lock()  # the pipe's sending end, and the numbers below
        self._next_id = 0
        self._next_call = 0
        self._waiting: dict[int, _Reply] = {}  # calls sent, by number, until answered
        info = self._startup_reply(progress)  # until the engine is warm (or failed to start)
        self.cfg = info["cfg"]
        self.step_seconds: dict[str, float] = info["step_seconds"]
        self.startup: StartupReport = info["startup"]
        self.device = torch.device(info["device"])  # a name only: CUDA stays in the child
        # an engine that batches its sessions' steps does so in the child too (one thread
        # a session there): the server's sessions then run side by side, as in-process
        self.batches_steps: bool = info["batches_steps"]
        self.capacity: int | None = info["capacity"]
        self._plan = ChunkPlan(self.cfg.schedule)
        self._reader = threading.Thread(
            target=self._read_replies, name="engine-replies", daemon=True
        )
        self._reader.start()

    def stream_step(self, k: int) -> StreamStep:
        cfg = self.cfg
        return self._plan.step(k, cfg.frames_per_latent, cfg.lookahead_frames)

    def new_stream(
        self, reference_rgb: Reference, seed: int = 0, prompt: str | None = None
    ) -> RemoteStream:
        with self._lock:
            self._next_id += 1
            sid = self._next_id
        cfg = self.cfg
        frames = 2 * max(self.stream_step(0).frames, self.stream_step(1).frames)
        return RemoteStream(self, sid, reference_rgb, seed, frames, cfg.video, prompt)

    def gpu_memory(self) -> tuple[int, int] | None:
        return self.call("memory") if self.device.type == "cuda" else None

    def batching(self) -> tuple[int, int] | None:
        return self.call("batching") if self.batches_steps else None

    def call(self, op: str, *args: object):
        """Send one call and wait for its answer; other threads' calls go on meanwhile."""
        return self._send(op, args).wait()

    def call_in_pieces(self, op: str, *args: object) -> Generator[Any, None, Any]:
        """Send one call whose answer comes in pieces: yields each as it arrives, and
        returns the final answer (the generator's value)."""
        reply = self._send(op, args)
        while (piece := reply.pieces.get()) is not _END:
            yield piece
        return reply.wait()

    def _send(self, op: str, args: tuple) -> _Reply:
        reply = _Reply()
        with self._lock:
            if not self._proc.is_alive():
                raise EngineProcessError(f"the engine process is gone (exit {self._proc.exitcode})")
            self._next_call += 1
            number = self._next_call
            self._waiting[number] = reply
            try:
                self._conn.send((number, op, *args))
            except (OSError, EOFError) as exc:
                del self._waiting[number]
                raise EngineProcessError(f"the engine process is gone: {exc}") from None
        return reply

    def close(self) -> None:
        try:
            with self._lock:
                self._conn.send((0, "exit"))
        except (OSError, EOFError):
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._reader.join(5)
        self._conn.close()

    def _read_replies(self) -> None:
        """Hand each answer to the call waiting for it; when the child is gone, fail them all."""
        while True:
            try:
                number, ok, value = self._conn.recv()
            except (OSError, EOFError):
                break
            with self._lock:
                reply = self._waiting.get(number) if ok is None else self._waiting.pop(number, None)
            if reply is not None and ok is None:  # a piece of an answer still coming
                reply.pieces.put(value)
            elif reply is not None:
                reply.set(ok, value)
        self._proc.join(1)
        gone = EngineProcessError(f"the engine process died (exit {self._proc.exitcode})")
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for reply in waiting:
            reply.fail(gone)

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def _startup_reply(self, progress: Progress | None):
        """The child's start-up: each part as it begins (to `progress`), then the engine's
        description, or why it failed."""
        while True:
            try:
                _, ok, value = self._conn.recv()
            except (OSError, EOFError):
                raise EngineProcessError(
                    f"the engine process died (exit {self._proc.exitcode})"
                ) from None
            if ok is None:  # a part of start-up begins
                if progress is not None:
                    progress(value)
                continue
            if not ok:
                raise EngineProcessError(value)
            return value


_END = object()  # the last of a call's pieces


@dataclass
class _Reply:
    """One call's answer, waited for by the thread that made the call, and the pieces
    that came before it (`call_in_pieces`)."""

    done: threading.Event = field(default_factory=threading.Event)
    value: object = None
    error: BaseException | None = None
    pieces: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    def set(self, ok: bool, value: object) -> None:
        if ok:
            self.value = value
        else:
            self.error = EngineProcessError(value)
        self.done.set()
        self.pieces.put(_END)

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()
        self.pieces.put(_END)

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


class RemoteStream:
    """A stream living in the engine process: `pipeline.stream.AvatarStream` over the pipe,
    frames back through shared memory."""

    def __init__(
        self,
        host: EngineProcess,
        sid: int,
        reference_rgb: Reference,
        seed: int,
        max_frames: int,
        video,
        prompt: str | None = None,
    ) -> None:
        self._host = host
        self.id = sid
        self._shape = (video.height, video.width, 3)
        self._shm = SharedMemory(create=True, size=max_frames * int(np.prod(self._shape)))
        self._max_frames = max_frames
        self._needed = host.call(
            "open", sid, reference_rgb, seed, prompt, self._shm.name, max_frames
        )
        self.closed = False

    def push_audio(self, samples: np.ndarray) -> None:
        self._needed = self._host.call("push", self.id, np.asarray(samples, np.float32))

    def samples_needed(self) -> int:
        """Known without asking: every reply carries it."""
        return self._needed

    def generate_ready(self) -> list[FrameBatch]:
        return self._frames(*self._host.call("generate", self.id))

    def iter_ready(self) -> Iterator[FrameBatch]:
        """`generate_ready`, each batch as soon as the child's stream has made it (FlashHead
        Pro's first decode pass leaves before the rest of its step, as in-process)."""
        pieces = self._host.call_in_pieces("pieces", self.id)
        while True:
            try:
                placed = next(pieces)
            except StopIteration as answer:
                self._needed = answer.value
                return
            yield self._batch(placed)

    def finish(self) -> list[FrameBatch]:
        return self._frames(*self._host.call("finish", self.id))

    def _frames(self, placed: list, needed: int) -> list[FrameBatch]:
        self._needed = needed
        return [self._batch(p) for p in placed]

    def _batch(self, placed: tuple) -> FrameBatch:
        """A batch as the child placed it: in this session's buffer, or pickled where it
        did not fit (never in serving)."""
        start, count, offset, pickled = placed
        if pickled is not None:
            return FrameBatch(start, pickled)
        view = np.ndarray((count, *self._shape), np.uint8, self._shm.buf, offset=offset)
        return FrameBatch(start, view.copy())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._host.call("close", self.id)
        except EngineProcessError:
            pass  # the process is gone: nothing to close there
        finally:
            self._shm.close()
            self._shm.unlink()


# ---- the child ---------------------------------------------------------------------------


def _serve_engine(conn: Connection, options: EngineOptions, levels: dict[str, int]) -> None:
    """The engine process: start the engine, then answer calls until told to exit. Each
    session's calls run in order on its own thread (`_Lane`), so different sessions' steps
    wait in the engine together, where a batching engine runs them as one batch. It logs
    as the server does (`levels`), so the server's log shows its start-up's progress."""
    from pipeline.startup import freeze_long_lived_objects, start_engine

    setup_logging_as(levels)

    try:
        engine, report = start_engine(options, lambda phase: conn.send((0, None, phase)))
    except Exception as exc:
        conn.send((0, False, f"{type(exc).__name__}: {exc}"))
        return
    freeze_long_lived_objects()
    info = {
        "cfg": engine.cfg,
        "step_seconds": engine.step_seconds,
        "startup": report,
        "device": str(engine.device),
        "batches_steps": getattr(engine, "batcher", None) is not None,
        "capacity": getattr(engine, "capacity", None),
    }
    conn.send((0, True, info))
    _answer_calls(conn, engine)


def _answer_calls(conn: Connection, engine) -> None:
    """Until told to exit: each call answered by number, a session's on its own lane."""
    sending = threading.Lock()

    def send(message: tuple) -> None:
        with sending:
            conn.send(message)

    def answer(number: int, call) -> None:
        try:
            reply = (number, True, call())
        except Exception as exc:  # reported to the caller; the process serves on
            detail = traceback.format_exc(limit=4)
            reply = (number, False, f"{type(exc).__name__}: {exc}\n{detail}")
        send(reply)

    sessions: dict[int, tuple] = {}
    lanes: dict[int, _Lane] = {}
    while True:
        try:
            number, op, *args = conn.recv()
        except (OSError, EOFError):  # the server went away
            break
        if op == "exit":
            break
        if op in ENGINE_CALLS:
            answer(number, lambda op=op: ENGINE_CALLS[op](engine))
            continue
        sid = args[0]
        if op == "open":
            lanes[sid] = _Lane(answer, name=f"engine-session-{sid}")
        lane = lanes.get(sid)
        if lane is None:
            answer(number, lambda sid=sid: _no_session(sid))
            continue

        def piece(value, number=number) -> None:  # a piece of this call's answer
            send((number, None, value))

        lane.put(
            number, lambda op=op, args=args, piece=piece: _handle(engine, sessions, op, args, piece)
        )
        if op == "close":
            lane.stop()
            del lanes[sid]
    _close_all(lanes, sessions)


def _close_all(lanes: dict, sessions: dict) -> None:
    for lane in lanes.values():
        lane.stop()
    for lane in lanes.values():
        lane.join(5)  # a step under way ends before its session closes
    for session, shm, _ in list(sessions.values()):
        session.close()
        shm.close()


# calls about the engine, not a session: answered at once, in the order they come
ENGINE_CALLS = {
    "memory": lambda engine: gpu_memory(engine.device),
    "batching": lambda e: batch_counts(e),
}


def _no_session(sid: int):
    raise KeyError(f"no open session {sid}")


class _Lane:
    """One session's calls in the child, run in order on a thread of their own."""

    def __init__(self, answer, name: str) -> None:
        self._answer = answer
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, number: int, call) -> None:
        self._calls.put((number, call))

    def stop(self) -> None:
        """End the thread once the calls already put have run."""
        self._calls.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            self._answer(*item)


class _FramePlacer:
    """One call's frames into the session's shared buffer, one after another (the caller
    copies each out before its next call), or pickled where they would not fit."""

    def __init__(self, shm: SharedMemory, max_frames: int) -> None:
        self.shm, self.offset, self.room = shm, 0, max_frames

    def __call__(self, batch: FrameBatch) -> tuple[int, int, int, np.ndarray | None]:
        frames = np.ascontiguousarray(batch.frames)
        if len(frames) > self.room:
            return batch.start, len(frames), 0, frames
        np.ndarray(frames.shape, np.uint8, self.shm.buf, offset=self.offset)[:] = frames
        placed = (batch.start, len(frames), self.offset, None)
        self.offset += frames.nbytes
        self.room -= len(frames)
        return placed


def batch_counts(engine) -> tuple[int, int] | None:
    """(batches, steps in them) an engine's step batcher ran so far; None where it has none."""
    batcher = getattr(engine, "batcher", None)
    return None if batcher is None else (batcher.batches, batcher.jobs)


def gpu_memory(device: torch.device) -> tuple[int, int] | None:
    """(allocated now, peak) bytes of torch's allocator on `device`; None on a CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)


def _handle(engine, sessions: dict, op: str, args: list, piece: Callable[[object], None]):
    if op == "memory":
        return gpu_memory(engine.device)
    if op == "open":
        sid, reference, seed, prompt, shm_name, max_frames = args
        session = (
            engine.new_stream(reference, seed=seed)
            if prompt is None
            else engine.new_stream(reference, seed=seed, prompt=prompt)
        )
        # the server owns and unlinks the buffer (a spawned child shares its resource
        # tracker, so attaching here registers nothing new)
        sessions[sid] = (session, SharedMemory(name=shm_name), max_frames)
        return session.samples_needed()
    session, shm, max_frames = sessions[args[0]]
    if op == "push":
        session.push_audio(args[1])
        return session.samples_needed()
    if op in ("generate", "finish"):
        made = session.generate_ready() if op == "generate" else session.finish()
        place = _FramePlacer(shm, max_frames)
        return [place(batch) for batch in made], session.samples_needed()
    if op == "pieces":  # generate, each batch sent on as soon as the stream has made it
        place = _FramePlacer(shm, max_frames)
        for batch in ready_pieces(session):
            piece(place(batch))
        return session.samples_needed()
    if op == "close":
        session.close()
        shm.close()
        del sessions[args[0]]
        return None
    raise ValueError(f"unknown engine call {op!r}")
