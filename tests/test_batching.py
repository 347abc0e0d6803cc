"""The step batcher: jobs waiting together run as one batch, each gets its own pieces in
order, a failure reaches exactly the jobs of its batch, and a reader that walks away
holds up nobody."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.batching import StepBatcher


def doubling(batches: list[list[int]]):
    def run(jobs: list[int]):
        batches.append(list(jobs))
        if any(j < 0 for j in jobs):
            raise ValueError(f"bad job in {jobs}")
        for p in range(3):  # three passes; the odd jobs have nothing in the middle one
            yield [None if (p == 1 and j % 2) else (j, p) for j in jobs]

    return run


def run_in_threads(batcher: StepBatcher, jobs: list[int]) -> tuple[dict, list[threading.Thread]]:
    got: dict = {}

    def work(j: int) -> None:
        try:
            got[j] = list(batcher.run(j))
        except Exception as exc:
            got[j] = exc

    threads = [threading.Thread(target=work, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    return got, threads


def wait_for(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_jobs_waiting_together_run_as_one_batch_and_each_gets_its_own_pieces():
    batches: list[list[int]] = []
    batcher = StepBatcher(doubling(batches), max_batch=4)
    with batcher.gathering():
        got, threads = run_in_threads(batcher, [1, 2, 4])
        wait_for(lambda: batcher.waiting == 3)
    for t in threads:
        t.join(5)
    assert len(batches) == 1 and sorted(batches[0]) == [1, 2, 4]
    assert got[1] == [(1, 0), (1, 2)]  # its middle pass made nothing for it
    assert got[2] == [(2, 0), (2, 1), (2, 2)]
    assert batcher.batches == 1 and batcher.jobs == 3
    batcher.close()


def test_a_batch_takes_at_most_max_batch_and_the_rest_run_next():
    batches: list[list[int]] = []
    batcher = StepBatcher(doubling(batches), max_batch=2)
    with batcher.gathering():
        got, threads = run_in_threads(batcher, [2, 4, 6])
        wait_for(lambda: batcher.waiting == 3)
    for t in threads:
        t.join(5)
    assert [len(b) for b in batches] == [2, 1]
    assert all(got[j] == [(j, 0), (j, 1), (j, 2)] for j in (2, 4, 6))
    batcher.close()


def test_a_failed_batch_fails_its_jobs_only_and_the_batcher_serves_on():
    batches: list[list[int]] = []
    batcher = StepBatcher(doubling(batches), max_batch=4)
    with batcher.gathering():
        got, threads = run_in_threads(batcher, [-1, 2])
        wait_for(lambda: batcher.waiting == 2)
    for t in threads:
        t.join(5)
    assert isinstance(got[-1], ValueError) and isinstance(got[2], ValueError)
    assert list(batcher.run(4)) == [(4, 0), (4, 1), (4, 2)]
    batcher.close()


def test_a_reader_that_stops_early_holds_up_nobody():
    batches: list[list[int]] = []
    batcher = StepBatcher(doubling(batches), max_batch=4)
    first = batcher.run(2)
    assert next(first) == (2, 0)
    first.close()  # its session closed mid-step
    assert list(batcher.run(4)) == [(4, 0), (4, 1), (4, 2)]
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        next(batcher.run(6))
