"""Call churn: a closed call gives back its memory and threads at once, without a GC pass.

Thirty calls one after another against the real server (tiny engine): clean hang-ups
from an in-process client, and peers killed with SIGKILL (a client process that never
says goodbye; the server notices the silence). The cyclic garbage collector is off for
the whole run, so anything kept alive by a reference cycle stays, as it would in a busy
server whose oldest generation is rarely collected.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import sys
import threading
import weakref

import pytest
from support.realtime import make_speech_wav, running_server, wait_until

from facecast_client import FacecastClient, PcmSource
from realtime.service import SERVICE
from realtime.session_config import SessionConfig

CALLS = 30


def rss_mb() -> float:
    """Resident memory in MB, after glibc hands its free heap pages back to the kernel: a
    reading of what live objects hold, not of the allocator's cache of freed pages (which
    moves by tens of MB with the engine's transient buffers and would make this flaky)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def threads() -> int:
    """Native threads of this process (FFmpeg codec threads included), less the event loop's
    default executor, a pool that grows on demand up to a fixed size and then stays."""
    pool = {t.native_id for t in threading.enumerate() if t.name.startswith("asyncio_")}
    return len(set(map(int, os.listdir("/proc/self/task"))) - pool)


ALONE = "FACECAST_CHURN_ALONE"  # set in the child process that runs the measurement


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_thirty_calls_leave_memory_and_threads_at_baseline(tmp_path):
    """Measured in a fresh process, as a server runs: in the suite's own process the
    threads and heap arenas that earlier tests leave behind (Ray's driver among them) move
    the RSS by more than the bound, whatever the calls do."""
    import subprocess

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         f"{__file__}::test_thirty_calls_measured_alone", "--basetemp", str(tmp_path / "child")],
        env={**os.environ, ALONE: "1"}, capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    print(run.stdout[-3000:])
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(not os.environ.get(ALONE), reason="run in its own process by the test above")
async def test_thirty_calls_measured_alone(tmp_path):
    speech = make_speech_wav(tmp_path / "s.wav", [0.2, "Hello there, how are you?", 0.3])
    config = SessionConfig(peer_timeout_s=1.0)  # a killed peer is noticed after 1 s
    async with running_server(session=config) as (url, app):
        service = app[SERVICE]
        closed: list[weakref.ref] = []

        async def live_session():
            await wait_until(lambda: len(service.sessions) == 1, 30)
            session = next(iter(service.sessions.values()))
            closed.append(weakref.ref(session))
            await wait_until(lambda: session.video.sent >= 5, 60)
            return session

        async def clean_call() -> None:
            client = FacecastClient(url, PcmSource.from_wav(speech.path))
            await client.connect()
            await live_session()
            await client.wait_frames(5)
            await client.close()  # DELETE, then hang up

        async def killed_call() -> None:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "facecast", "call", url, "--wav", str(speech.path),
                "--seconds", "60",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            try:
                await live_session()
            finally:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()

        async def call(n: int) -> None:
            await (killed_call() if n % 2 else clean_call())
            await wait_until(lambda: not service.sessions, 30)

        # Warm-up: first-use costs are not a leak (codecs, thread pools, and the allocator
        # arenas that each call's threads take from glibc and keep for the next calls).
        for n in range(6):
            await call(n)
        gc.collect()
        gc.disable()
        try:
            await asyncio.sleep(0.5)
            base_rss, base_threads = rss_mb(), threads()
            for n in range(CALLS):
                await call(n)
            await asyncio.sleep(0.5)  # codec threads finish their last frame and exit
            after_rss, after_threads = rss_mb(), threads()
            alive = sum(ref() is not None for ref in closed)
            cycles = ours_in_cycles()
        finally:
            gc.enable()
    print(f"RSS {base_rss:.0f} -> {after_rss:.0f} MB, threads {base_threads} -> {after_threads}")
    assert alive == 0, f"{alive} of {len(closed)} closed sessions still in memory"
    # nothing of a call (its engine stream above all: on a GPU, its tensors) waits in a
    # reference cycle for the collector; aiortc's own cycles are its business
    assert not cycles, cycles
    assert after_threads == base_threads
    assert after_rss <= base_rss * 1.10


def ours_in_cycles() -> dict[str, int]:
    """The project's objects that only a garbage collection would free (the collector's
    unreachable set, kept aside to be read), by class."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        kinds = [type(o) for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    ours = [f"{k.__module__}.{k.__qualname__}" for k in kinds]
    ours = [name for name in ours if name.startswith(("realtime.", "pipeline."))]
    return {name: ours.count(name) for name in sorted(set(ours))}
