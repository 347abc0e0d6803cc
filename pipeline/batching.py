"""Steps of several streams of one engine, run together as one batch.

One session's step leaves a large GPU partly idle between kernels and runs its small ops
(audio features, modulation, colour) one stream at a time; two sessions' steps taken in
turn also make each wait for the other's whole step. A `StepBatcher` owns one thread that
runs every step of an engine's streams: a stream's worker hands it a job (`run`) and reads
back that job's pieces as the batch makes them. The thread takes every job waiting when it
is free, up to `max_batch`, and never waits for a stream that has not asked: while the
engine keeps up, each step runs alone as soon as its audio is there; once steps queue up,
which is when throughput counts, they run together.

A job's pieces reach its worker through a queue of its own, so a worker that stops reading
(its session closed mid-step) holds up nobody; a failure of the batch reaches every job in
it, and the thread goes on with the next.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Job = TypeVar("Job")
Piece = TypeVar("Piece")

# run_batch(jobs) yields, pass by pass, one entry per job: its next piece, or None where a
# pass made nothing for that job
BatchRunner = Callable[[list[Job]], Iterator[list[Piece | None]]]


class _Done:
    pass


@dataclass
class _Ticket(Generic[Job]):
    job: Job
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)


class StepBatcher(Generic[Job, Piece]):
    def __init__(self, run_batch: BatchRunner, max_batch: int, name: str = "steps") -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self._run_batch = run_batch
        self._name = name
        self._cv = threading.Condition()
        self._waiting: list[_Ticket] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._held = 0
        self.batches = 0  # batches run, and the jobs in them: the mean batch size in use
        self.jobs = 0

    def run(self, job: Job) -> Iterator[Piece]:
        """The job's pieces, each as soon as its batch has made it (blocking)."""
        ticket: _Ticket = _Ticket(job)
        with self._cv:
            if self._closed:
                raise RuntimeError("the engine's step batcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._waiting.append(ticket)
            self._cv.notify()
        while True:
            item = ticket.out.get()
            if isinstance(item, _Done):
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    @property
    def waiting(self) -> int:
        """Jobs asked for and not yet taken into a batch."""
        with self._cv:
            return len(self._waiting)

    @contextmanager
    def gathering(self) -> Iterator[None]:
        """While inside, no new batch starts: jobs asked for meanwhile run together after
        (the warm-up times batches of each size this way)."""
        with self._cv:
            self._held += 1
        try:
            yield
        finally:
            with self._cv:
                self._held -= 1
                self._cv.notify()

    def close(self) -> None:
        """Stop the thread once the jobs already asked for have run."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while (not self._waiting or self._held) and not self._closed:
                    self._cv.wait()
                if not self._waiting:
                    return
                batch = self._waiting[: self.max_batch]
                del self._waiting[: len(batch)]
            self.batches += 1
            self.jobs += len(batch)
            try:
                for pieces in self._run_batch([t.job for t in batch]):
                    for ticket, piece in zip(batch, pieces, strict=True):
                        if piece is not None:
                            ticket.out.put(piece)
            except Exception as exc:  # every job of the batch fails with it; the thread serves on
                log.debug("%s: a batch of %d failed: %s", self._name, len(batch), exc)
                for ticket in batch:
                    ticket.out.put(exc)
            for ticket in batch:
                ticket.out.put(_Done())
