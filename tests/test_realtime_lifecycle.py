"""`facecast serve` as an operator runs it: SIGINT/SIGTERM close every peer cleanly."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path

import pytest
from support.realtime import make_speech_wav

from facecast_client import FacecastClient, PcmSource, wait_until_ready

# Starts `facecast serve` as a process and calls it, once per signal.
pytestmark = pytest.mark.slow

FACECAST = Path(sys.executable).with_name("facecast")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_closes_all_peers_cleanly(tmp_path, sig):
    speech = make_speech_wav(tmp_path / "s.wav", [0.3, "Hello there, how are you?", 0.3])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        str(FACECAST),
        "serve",
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--port",
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await wait_until_ready(url, timeout=60)
        client = FacecastClient(url, PcmSource.from_wav(speech.path))
        await client.connect()
        await client.wait_frames(10, timeout=40)
        proc.send_signal(sig)
        closed = await client.wait_event("session_closed", timeout=10)
        rc = await asyncio.wait_for(proc.wait(), 20)
        log = (await proc.stdout.read()).decode()
        await client.close(release=False)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0, log
    assert closed["reason"] == "server shutting down"
    assert "Traceback" not in log, log
