"""Agent-facing behaviour: interrupt, playback events, isolation, capacity, lifecycle."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import aiohttp
import numpy as np
import pytest
from support.realtime import (
    RATE,
    load_test_engine,
    make_speech_wav,
    normalized_xcorr_peak,
    rms,
    running_server,
    wait_until,
)

from facecast_client import FacecastClient, PcmSource
from realtime.service import SERVICE

LONG = "This is a long sentence that keeps going for quite a while, so we can cut it off."


def chunk_seconds() -> float:
    cfg = load_test_engine().cfg
    return cfg.schedule.chunk_latents * cfg.diffusion.vae.temporal_ratio / cfg.video.fps


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_interrupt_flushes_queued_speech_within_one_chunk(tmp_path):
    speech = make_speech_wav(tmp_path / "long.wav", [0.3, LONG, 0.3])
    async with running_server() as (url, app):
        # An agent pushes its TTS three times faster than real time: most of it is queued.
        client = FacecastClient(url, PcmSource.from_wav(speech.path, speed=3.0), keep_frames=True)
        await client.connect()
        started = await client.wait_event("playback_started", timeout=30)
        # all of it sent (and so queued on the server) before the interrupt: a pushed call
        # starts playing within a step now, while the agent may still be sending
        await wait_until(lambda: client.source.ended_at is not None, timeout=10)
        session = app[SERVICE].sessions[client.session_id]
        depths = []
        for _ in range(10):  # audio is queued far ahead; generation still stays within lead
            depths.append(session.frames.depth())
            await asyncio.sleep(0.1)
        rec = client.received
        head_pts = rec.audio_pts[-1] - rec.audio_pts[0]  # returned audio heard so far
        before = rec.audio_timeline()
        t_interrupt = time.monotonic()
        played_ms = await client.interrupt()
        finished = await client.wait_event("playback_finished", timeout=5)
        await asyncio.sleep(3 * chunk_seconds() + 1.0)
        async with aiohttp.ClientSession() as http:  # the HTTP route works too
            async with http.post(f"{url}/sessions/{client.session_id}/interrupt") as r:
                assert r.status == 200 and (await r.json())["played_ms"] == 0
        after = rec.audio_timeline()
        await client.close()

    assert rms(before[-RATE // 2 :]) > 300, "speech was playing before the interrupt"
    lead = session.frames.lead
    assert max(depths) <= lead + 2 * 12, (depths, lead)  # lead plus one engine burst
    total_ms = (speech.segments[0][1] - speech.segments[0][0]) * 1000
    assert 500 < played_ms < total_ms - 1000, (played_ms, total_ms)
    assert finished["interrupted"] is True and finished["position_ms"] == played_ms
    assert started["_t"] < finished["_t"] and finished["_t"] - t_interrupt < 1.0
    # Within one chunk of where the listener was, the avatar stops saying the speech.
    cut = head_pts + int(chunk_seconds() * RATE)
    tail = after[cut:]
    assert tail.size > RATE, "the call went on after the interrupt"
    assert rms(tail) < 30, rms(tail)
    kinds = [e["type"] for e in client.events if e["type"].startswith("playback")]
    assert kinds == ["playback_started", "playback_finished"]
    # Lips too: of the frames generated ahead, at most one chunk is still shown; the video
    # never freezes (frames keep arriving and changing) while idle frames take over.
    now, cut, _ = session.last_interrupt
    assert cut - now <= round(chunk_seconds() * 25), session.last_interrupt
    frames_after = [
        f
        for f, t in zip(rec.frames, rec.video_arrival, strict=True)
        if t > t_interrupt + chunk_seconds() + 0.5
    ]
    assert len(frames_after) > 25
    assert len({f.tobytes() for f in frames_after}) > 5, "video froze after the interrupt"


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_two_sessions_are_isolated_and_the_third_is_refused(tmp_path):
    a = make_speech_wav(tmp_path / "a.wav", [0.3, "One two three four five six seven.", 0.3])
    b = make_speech_wav(
        tmp_path / "b.wav", [0.3, "Guten Tag, wie geht es dir heute?", 0.3], voice="de"
    )
    async with running_server(max_sessions=2) as (url, app):
        ca = FacecastClient(url, PcmSource.from_wav(a.path), seed=1)
        cb = FacecastClient(url, PcmSource.from_wav(b.path), seed=2)
        await asyncio.gather(ca.connect(), cb.connect())
        third = FacecastClient(url, PcmSource.from_wav(a.path))
        with pytest.raises(ConnectionError, match="503.*full"):
            await third.connect()
        await asyncio.gather(ca.wait_frames(25, timeout=40), cb.wait_frames(25, timeout=40))
        await asyncio.sleep(max(a.duration, b.duration) + 1.5)
        assert len(app[SERVICE].sessions) == 2
        await asyncio.gather(ca.close(), cb.close())
        await wait_until(lambda: not app[SERVICE].sessions, 5)

    got_a, got_b = ca.received.audio_timeline(), cb.received.audio_timeline()
    own_a, own_b = normalized_xcorr_peak(got_a, a.pcm), normalized_xcorr_peak(got_b, b.pcm)
    cross_a, cross_b = normalized_xcorr_peak(got_a, b.pcm), normalized_xcorr_peak(got_b, a.pcm)
    assert own_a > 0.6 and own_b > 0.6, (own_a, own_b)
    assert cross_a < 0.25 and cross_b < 0.25, (cross_a, cross_b)
    assert ca.session_id != cb.session_id and len(ca.session_id) >= 22
    assert len(ca.received.video_pts) > 50 and len(cb.received.video_pts) > 50


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_killed_peer_is_cleaned_up_within_10_s(tmp_path):
    speech = make_speech_wav(tmp_path / "s.wav", [0.3, LONG, 0.3])
    async with running_server() as (url, app):
        service = app[SERVICE]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "facecast",
            "call",
            url,
            "--wav",
            str(speech.path),
            "--seconds",
            "60",
            cwd=os.getcwd(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await wait_until(lambda: any(s.video.sent > 10 for s in service.sessions.values()), 40)
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        session = next(iter(service.sessions.values()))
        waited = await wait_until(lambda: not service.sessions, 10.0)
        await asyncio.sleep(0.2)
        assert session.state == "closed" and waited <= 10.0
        assert session.worker.exited.is_set(), "generation thread still running"
        assert all(t.done() for t in session.tasks)
        leftover = [t for t in asyncio.all_tasks() if session.id[:8] in t.get_name()]
        assert not leftover, leftover
        assert session.worker._engine is not None and session.worker._engine.closed
        assert session.pc.connectionState == "closed"
        print(f"killed peer cleaned up after {waited:.1f} s ({session.close_reason})")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_nan_clipped_and_silent_audio_never_crash_a_session(tmp_path):
    speech = make_speech_wav(tmp_path / "s.wav", ["Hello there."])
    nasty = np.concatenate(
        [
            np.full(RATE // 2, np.nan),
            np.full(RATE // 4, np.inf),
            np.full(RATE // 4, -np.inf),
            5.0 * np.sign(np.sin(np.arange(RATE) / 10.0)),  # heavily clipped square wave
            np.zeros(RATE),
        ]
    ).astype(np.float32)
    source = PcmSource()
    source.push(nasty)
    source.push(speech.pcm)
    async with running_server() as (url, app):
        client = FacecastClient(url, source, keep_frames=True)
        await client.connect()
        await client.wait_frames(25, timeout=40)
        await asyncio.sleep(nasty.size / RATE + speech.duration)
        session = app[SERVICE].sessions[client.session_id]
        assert session.state == "live"
        await client.close()
    assert not [e for e in client.events if e["type"] == "error"]
    assert len(client.received.video_pts) > 75


class FailingEngine:
    """The real engine, except that each session's third generate_ready() raises."""

    def __init__(self, engine) -> None:
        self.cfg, self.device, self.startup = engine.cfg, engine.device, engine.startup
        self._engine = engine
        self.stream_step = engine.stream_step
        self.step_seconds = engine.step_seconds

    def new_stream(self, reference_rgb, seed=0):
        session = self._engine.new_stream(reference_rgb, seed=seed)
        calls = 0
        real = session.generate_ready

        def generate_ready():
            nonlocal calls
            calls += 1
            if calls == 3:
                raise RuntimeError("simulated CUDA error")
            return real()

        session.generate_ready = generate_ready
        return session


@pytest.mark.timeout(120)
async def test_generation_error_ends_only_that_session(tmp_path):
    speech = make_speech_wav(tmp_path / "s.wav", [0.3, LONG])
    engine = FailingEngine(load_test_engine())
    async with running_server(engine=engine) as (url, app):
        client = FacecastClient(url, PcmSource.from_wav(speech.path))
        await client.connect()
        error = await client.wait_event("error", timeout=40)
        assert "simulated CUDA error" in error["message"]
        await wait_until(lambda: not app[SERVICE].sessions, 10)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/healthz") as r:
                assert r.status == 200
            async with http.get(f"{url}/metrics") as r:
                assert "facecast_session_errors_total 1.0" in await r.text()
        await client.close(release=False)
