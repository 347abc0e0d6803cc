"""The default avatar served on this (CI's) 2-core machine for a minute, as a user runs it:
`facecast serve` with the default config, an aiortc client speaking with pauses; alone, and
with a process burning a core beside it. Judged by the server's own counters."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from support.realtime import REAL_TIME_ON_A_SHARED_CPU, make_speech_wav

from facecast_client import FacecastClient, PcmSource, wait_until_ready
from facecast_client.call import call_stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = [0.5, "Hello, I am the avatar, and I say what you say.", 1.2,
        "The quick brown fox jumps over the lazy dog.", 0.8]  # fmt: skip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    return make_speech_wav(tmp_path_factory.mktemp("wav") / "speech.wav", PLAN)


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "facecast", "serve", "--port", str(port), "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            break
        except OSError:
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)


async def call(url: str, wav, seconds: float) -> tuple[dict, dict]:
    await wait_until_ready(url, timeout=120)
    client = FacecastClient(url, PcmSource.from_wav(wav, loop=True))
    await client.connect()
    await asyncio.sleep(seconds)
    async with aiohttp.ClientSession() as http:
        listed = (await (await http.get(f"{url}/sessions")).json())["sessions"]
    await client.close()
    return next(s for s in listed if s["id"] == client.session_id), call_stats(client)


@pytest.mark.timeout(150)
@REAL_TIME_ON_A_SHARED_CPU
async def test_default_config_alone_every_frame_fresh_for_a_minute(server, speech):
    stats, seen = await call(server, speech.path, 60.0)
    assert stats["frames_sent"] >= 1450, stats
    assert stats["fresh_share"] >= 0.98, stats
    assert seen["max_gap_ms"] <= 200, seen
    assert stats["ttff_ms"] <= 1200, stats
    assert abs(seen["av_offset_ms"]) <= 40, seen


@pytest.mark.timeout(150)
@REAL_TIME_ON_A_SHARED_CPU
async def test_default_config_beside_a_cpu_burner_shows_what_the_engine_makes(server, speech):
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: ASYNC220 - Popen returns at once; the child runs beside the loop
    try:
        stats, seen = await call(server, speech.path, 60.0)
    finally:
        burner.kill()
        burner.wait()
    due = stats["frames_generated"] - stats["frames_queued"]  # made, and past its deadline
    assert stats["frames_fresh"] >= 0.9 * due, stats
    assert seen["max_gap_ms"] <= 200, seen
    assert abs(seen["av_offset_ms"]) <= 40, seen
