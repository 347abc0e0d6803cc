"""The engine in a process of its own, so generation never waits for the media loop.

In one process, the engine's Python (thousands of kernel launches a step on a GPU, the
small ops of the CPU demo) takes turns on the GIL with the event loop, Opus, the resampler
and the VAD; under load, most visibly when an agent pushes audio five times faster than
real time, a step then takes up to twice its time. `EngineProcess` starts the engine in a
spawned child (`pipeline.startup.start_engine`: load, compile, warm-up) and offers what the
server's sessions use of an `Engine`: `cfg`, `stream_step`, `step_seconds`, `device`,
`new_stream`. Calls cross one pipe (serialised, like the engine itself); frames come back
through a shared-memory buffer per session, so a 720p step's 44 MB are copied once.

A failure inside the child is raised in the caller as `EngineProcessError`; the child
dying ends every session with that error, and the server with it reports `failed`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import traceback
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import torch

from pipeline.schedule import ChunkPlan, StreamStep
from pipeline.startup import EngineOptions
from pipeline.stream import FrameBatch, Reference, StartupReport

log = logging.getLogger(__name__)


class EngineProcessError(RuntimeError):
    """The engine process failed (an exception there, or the process is gone)."""


class EngineProcess:
    """A started engine in a child process; `new_stream` gives proxies of its sessions. A
    `realtime.engine_host.HostedEngine`."""

    own_process = True
    # its calls cross one pipe in turn, so sessions' steps never meet there to be batched
    batches_steps = False
    capacity = None

    def __init__(self, options: EngineOptions) -> None:
        ctx = mp.get_context("spawn")  # CUDA cannot be forked; a clean interpreter anyway
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve_engine, args=(child, options), name="facecast-engine", daemon=True
        )
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        self._next_id = 0
        info = self._reply()  # blocks until the engine is warm (or failed to start)
        self.cfg = info["cfg"]
        self.step_seconds: dict[str, float] = info["step_seconds"]
        self.startup: StartupReport = info["startup"]
        self.device = torch.device(info["device"])  # a name only: CUDA stays in the child
        self._plan = ChunkPlan(self.cfg.schedule)

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

    def call(self, op: str, *args: object):
        with self._lock:
            if not self._proc.is_alive():
                raise EngineProcessError(f"the engine process is gone (exit {self._proc.exitcode})")
            try:
                self._conn.send((op, *args))
            except (OSError, EOFError) as exc:
                raise EngineProcessError(f"the engine process is gone: {exc}") from None
            return self._reply()

    def close(self) -> None:
        try:
            with self._lock:
                self._conn.send(("exit",))
        except (OSError, EOFError):
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def _reply(self):
        try:
            ok, value = self._conn.recv()
        except (OSError, EOFError):
            raise EngineProcessError(
                f"the engine process died (exit {self._proc.exitcode})"
            ) from None
        if not ok:
            raise EngineProcessError(value)
        return value


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

    def finish(self) -> list[FrameBatch]:
        return self._frames(*self._host.call("finish", self.id))

    def _frames(self, batches: list, needed: int) -> list[FrameBatch]:
        self._needed = needed
        out: list[FrameBatch] = []
        offset = 0
        for start, count, pickled in batches:
            if pickled is not None:  # more than the buffer holds (never in serving)
                out.append(FrameBatch(start, pickled))
                continue
            view = np.ndarray((count, *self._shape), np.uint8, self._shm.buf, offset=offset)
            out.append(FrameBatch(start, view.copy()))
            offset += view.nbytes
        return out

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


def _serve_engine(conn: Connection, options: EngineOptions) -> None:
    """The engine process: start the engine, then answer calls until told to exit."""
    from pipeline.startup import freeze_long_lived_objects, start_engine

    try:
        engine, report = start_engine(options)
    except Exception as exc:
        conn.send((False, f"{type(exc).__name__}: {exc}"))
        return
    freeze_long_lived_objects()
    info = {
        "cfg": engine.cfg,
        "step_seconds": engine.step_seconds,
        "startup": report,
        "device": str(engine.device),
    }
    conn.send((True, info))
    sessions: dict[int, tuple] = {}
    while True:
        try:
            op, *args = conn.recv()
        except (OSError, EOFError):  # the server went away
            break
        if op == "exit":
            break
        try:
            conn.send((True, _handle(engine, sessions, op, args)))
        except Exception as exc:  # reported to the caller; the process serves on
            detail = traceback.format_exc(limit=4)
            conn.send((False, f"{type(exc).__name__}: {exc}\n{detail}"))
    for session, shm, _ in sessions.values():
        session.close()
        shm.close()


def gpu_memory(device: torch.device) -> tuple[int, int] | None:
    """(allocated now, peak) bytes of torch's allocator on `device`; None on a CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)


def _handle(engine, sessions: dict, op: str, args: list):
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
        layout: list[tuple[int, int, np.ndarray | None]] = []
        offset, room = 0, max_frames
        for batch in made:
            frames = np.ascontiguousarray(batch.frames)
            if len(frames) > room:
                layout.append((batch.start, len(frames), frames))
                continue
            np.ndarray(frames.shape, np.uint8, shm.buf, offset=offset)[:] = frames
            layout.append((batch.start, len(frames), None))
            offset += frames.nbytes
            room -= len(frames)
        return layout, session.samples_needed()
    if op == "close":
        session.close()
        shm.close()
        del sessions[args[0]]
        return None
    raise ValueError(f"unknown engine call {op!r}")
