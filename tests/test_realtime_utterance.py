"""The utterance audio channel (`realtime.utterance`): on the data channel and the WebSocket
`/sessions/{id}/speech`, against the real server with the tiny engine."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import numpy as np
import pytest
from support.realtime import (
    RATE,
    ScriptedEngine,
    espeak,
    rms,
    running_server,
    wait_until,
)

from facecast_client import FacecastClient, PcmSource, SpeechSocket
from pipeline.clock import OUTPUT_SAMPLES_PER_PACKET
from realtime.errors import BadRequest
from realtime.service import SERVICE
from realtime.session_config import SessionConfig
from realtime.utterance import UtteranceChannel

PHRASES = [
    "One small step.",
    "The weather is nice today.",
    "Please hold the line for a moment.",
    "Seven.",
]
LOUD = 1000


def first_loud(pcm: np.ndarray) -> int:
    return int(np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)[0])


def first_loud_arrival(client: FacecastClient, after_sample: int = 0) -> float | None:
    """When the first returned 20 ms with speech in it (at or after `after_sample` of the
    avatar's timeline) arrived: the audio leaves with the frame made from it."""
    rec = client.received
    if not rec.audio_pts:
        return None
    base = rec.audio_pts[0]
    for pts, pcm, t in zip(rec.audio_pts, rec.audio, rec.audio_arrival, strict=True):
        if pts - base >= after_sample and np.abs(pcm.astype(np.int32)).max() > LOUD:
            return t
    return None


def events(source, kind: str) -> list[dict]:
    return [e for e in source.events if e["type"] == kind]


@pytest.mark.slow  # two served calls
@pytest.mark.timeout(180)
async def test_pushed_utterance_is_said_sooner_than_the_same_audio_on_the_mic():
    """Both calls idle for a second first (the avatar is on screen), then the same speech
    comes: on the microphone track in real time, or as an utterance at 5x. Measured from
    the first sent sample of speech to the first returned one (in sync with the lips)."""
    speech = espeak("Hello there, how can I help you today?")
    quiet = np.zeros(RATE, np.int16)
    async with running_server() as (url, app):
        mic = FacecastClient(url, PcmSource(np.concatenate([quiet, speech])))
        await mic.connect()
        loud = quiet.size + first_loud(speech)
        await wait_until(lambda: len(mic.source.sent) > loud + 2 * RATE, 60)
        await wait_until(lambda: first_loud_arrival(mic) is not None, 30)
        mic_ttff = app[SERVICE].sessions[mic.session_id].ttff_s
        mic_s = first_loud_arrival(mic) - mic.source.sent_at[loud // OUTPUT_SAMPLES_PER_PACKET]
        await mic.close()

        agent = FacecastClient(url, None)
        await agent.connect()
        await agent.wait_channel_open()
        await agent.wait_frames(25, timeout=60)  # the avatar is on screen, idle
        agent_ttff = app[SERVICE].sessions[agent.session_id].ttff_s
        sent = time.monotonic()
        await agent.speech.say(speech, RATE, speed=5.0)
        started = await agent.wait_event("playback_started", timeout=30)
        await agent.wait_event("playback_finished", timeout=30)
        agent_s = first_loud_arrival(agent, started["at_sample"]) - sent
        await agent.close()

    print(
        f"first speech on screen: microphone {mic_s:.2f} s, utterance channel x5 "
        f"{agent_s:.2f} s (playback_started after {started['_t'] - sent:.2f} s); "
        f"time to first (idle) frame: {mic_ttff:.2f} s / {agent_ttff:.2f} s"
    )
    assert agent_s < mic_s, (agent_s, mic_s)


def utterances() -> list[np.ndarray]:
    return [espeak(p) for p in PHRASES]


@pytest.mark.slow  # a served call for 25 s
@pytest.mark.timeout(300)
async def test_twenty_utterances_ten_clears_exact_once_and_in_order():
    """Over the WebSocket, with the avatar watched over WebRTC: every second utterance is
    cleared, half of them before any of it is shown and half while it is being said."""
    clips = utterances()
    async with running_server() as (url, app):
        viewer = FacecastClient(url, None)
        await viewer.connect()
        await viewer.wait_channel_open()
        socket = SpeechSocket(url, viewer.session_id)
        await socket.connect()
        said: list[tuple[str, int, bool]] = []  # (id, samples, cleared)
        for i in range(20):
            pcm, uid = clips[i % len(clips)], f"u{i}"
            after = time.monotonic()
            await socket.speech.say(pcm, RATE, uid=uid)
            if i % 4 == 1:
                await socket.speech.clear_buffer(uid)  # before it is shown
            elif i % 4 == 3:
                start = await socket.wait_event("playback_started", 30, after)
                assert start["id"] == uid
                await asyncio.sleep(0.3)
                await socket.speech.clear_buffer(uid)  # while it is said
            finished = await socket.wait_event("playback_finished", 30, after)
            assert finished["id"] == uid, finished
            said.append((uid, pcm.size, i % 2 == 1))
        await asyncio.sleep(0.5)
        session = app[SERVICE].sessions[viewer.session_id]
        assert session.state == "live" and not session.speech.queue
        async with aiohttp.ClientSession() as http:
            metrics = await (await http.get(f"{url}/metrics")).text()
        assert 'facecast_utterances_total{outcome="played"} 10.0' in metrics
        assert 'facecast_utterances_total{outcome="interrupted"} 10.0' in metrics
        await socket.close()
        returned = viewer.received.audio_timeline()
        await viewer.close()

    assert not events(socket, "error"), events(socket, "error")
    starts = {e["id"]: e for e in events(socket, "playback_started")}
    finishes = events(socket, "playback_finished")
    assert [e["id"] for e in finishes] == [uid for uid, _, _ in said]  # once each, in order
    assert len(events(socket, "playback_started")) == len(starts)
    last = 0
    for (uid, samples, cleared), fin in zip(said, finishes, strict=True):
        position = fin["playback_position"]
        assert fin["interrupted"] is cleared, fin
        if not cleared:
            assert abs(position - samples / RATE) < 0.001, (fin, samples / RATE)
        else:
            assert 0 <= position < samples / RATE, fin
        if uid in starts:
            begin = starts[uid]["at_sample"]
            assert starts[uid]["_t"] <= fin["_t"]
            assert last <= begin <= fin["at_sample"], (last, starts[uid], fin)
            assert fin["at_sample"] - begin == round(position * RATE)
            # exact: the avatar's returned audio is speech up to the position, silent after
            if position > 0.2:
                assert rms(returned[begin : fin["at_sample"]]) > 300, fin
            if cleared and fin["at_sample"] + 4 * OUTPUT_SAMPLES_PER_PACKET < returned.size:
                after_cut = returned[
                    fin["at_sample"] + OUTPUT_SAMPLES_PER_PACKET : fin["at_sample"]
                    + 4 * OUTPUT_SAMPLES_PER_PACKET
                ]
                assert rms(after_cut) < 30, (fin, rms(after_cut))
            last = fin["at_sample"]
        else:
            assert cleared and position == 0, fin  # cleared before any of it was shown
    assert sum(uid not in starts for uid, _, _ in said) >= 1


@pytest.mark.timeout(180)
async def test_bad_utterance_messages_get_errors_and_the_session_goes_on():
    config = SessionConfig(utterance_idle_s=1.0)
    pcm = espeak("Still here.")
    async with running_server(session=config) as (url, app):
        viewer = FacecastClient(url, None)
        await viewer.connect()
        await viewer.wait_channel_open()
        sock = SpeechSocket(url, viewer.session_id)
        await sock.connect()
        send = sock.speech._out

        async def error_for(data, expect: str) -> dict:
            after = time.monotonic()
            await send(data)
            error = await sock.wait_event("error", 5, after)
            assert expect in error["message"], error
            return error

        await error_for(json.dumps({"type": "say_hello"}), "unknown message type")
        await error_for("not json", "not JSON")
        await error_for(b"\x00\x01" * 100, "no open utterance")
        await error_for(
            json.dumps({"type": "utterance_start", "id": "a", "sample_rate": 0}), "sample_rate"
        )
        await error_for(json.dumps({"type": "utterance_start", "id": "a"}), "sample_rate")
        await send(
            json.dumps(
                {"type": "utterance_start", "id": "a", "sample_rate": 16000, "num_channels": 2}
            )
        )
        await error_for(b"\x00" * 6, "whole int16 frames of 2 channel")  # 1.5 stereo frames
        await error_for(b"\x00" * (70 * 1024), "bytes")  # too large
        await send(np.zeros((1600, 2), np.int16).tobytes())  # 0.1 s, stereo: fine
        await send(json.dumps({"type": "utterance_end", "id": "a"}))
        done = await sock.wait_event("playback_finished", 10)
        assert done["id"] == "a" and abs(done["playback_position"] - 0.1) < 0.001
        await error_for(json.dumps({"type": "clear_buffer", "id": "a"}), "already finished")
        await error_for(json.dumps({"type": "utterance_end", "id": "zz"}), "none is open")

        # a stream that never ends is ended after the idle timeout, with what it had
        after = time.monotonic()
        await sock.speech.start("open", RATE)
        await sock.speech.audio(pcm.tobytes())
        error = await sock.wait_event("error", 5, after)
        assert "no utterance_end" in error["message"] and error["id"] == "open"
        cut = await sock.wait_event("playback_finished", 10, after)
        assert cut["id"] == "open" and abs(cut["playback_position"] - pcm.size / RATE) < 0.001

        # the same messages on the data channel, and the session speaks on
        after = time.monotonic()
        viewer._channel.send(json.dumps({"type": "utterance_start", "id": "b"}))
        error = await viewer.wait_event("error", 5, after)
        assert "sample_rate" in error["message"]
        await viewer.speech.say(pcm, RATE, uid="c")
        done = await viewer.wait_event("playback_finished", 15, after)
        assert done["id"] == "c" and done["interrupted"] is False
        session = app[SERVICE].sessions[viewer.session_id]
        assert session.state == "live"

        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/sessions/nope/speech") as r:
                assert r.status == 404 and "no live session" in (await r.json())["error"]
            async with http.get(f"{url}/healthz") as r:
                assert r.status == 200
        await sock.close()
        await viewer.close()


@pytest.mark.timeout(60)
async def test_speech_socket_needs_the_token():
    async with running_server(token="s3cret") as (url, app):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/sessions/x/speech") as r:
                assert r.status == 401 and "token" in (await r.json())["error"]
        with pytest.raises(ConnectionError, match="401"):
            await SpeechSocket(url, "x").connect()


LONG_S = float(os.environ.get("FACECAST_LONG_SESSION_S", "600"))


@pytest.mark.slow
@pytest.mark.timeout(LONG_S + 200)
async def test_a_ten_minute_agent_session_is_ended_by_no_timer():
    """Ten minutes of an agent that speaks every 30 s through the channel (data channel
    and WebSocket in turn) and sends nothing in between: no microphone, no peer timeout,
    no session cap. The engine is the scripted one (it sleeps like a GPU step), so the
    test costs wall time, not the CI machine's two cores."""
    pcm = espeak("I am still here, and still talking.")
    async with running_server(engine=ScriptedEngine(rtf=0.3)) as (url, app):
        viewer = FacecastClient(url, None, record=False)
        await viewer.connect()
        await viewer.wait_channel_open()
        sock = SpeechSocket(url, viewer.session_id)
        await sock.connect()
        session = app[SERVICE].sessions[viewer.session_id]
        began, n = time.monotonic(), 0
        while time.monotonic() - began < LONG_S:
            sender = sock if n % 2 else viewer
            after = time.monotonic()
            await sender.speech.say(pcm, RATE, uid=f"t{n}")
            done = await sender.wait_event("playback_finished", 30, after)
            assert done["id"] == f"t{n}" and done["interrupted"] is False
            n += 1
            await asyncio.sleep(max(0.0, began + 30 * n - time.monotonic()))
        assert session.state == "live", session.close_reason
        assert not sock.closed
        before_end = session.video.sent
        await asyncio.sleep(10)
        assert session.video.sent - before_end >= 125, "the video stopped"  # ≥ 12.5 fps
        sent = session.video.sent
        await sock.close()
        await viewer.close()
    # frames flowed all along (a loaded machine's stalls over 200 ms skip frames, not time)
    assert sent >= 25 * LONG_S * 0.5, sent
    print(f"{LONG_S:.0f} s, {n} utterances, {sent} frames sent")


class Timeline:
    """A stand-in for the session's side of `UtteranceChannel`: appends at a head, plays
    up to a position; inserts silence on demand."""

    def __init__(self) -> None:
        self.head = 0
        self.sent: list[dict] = []
        self.channel = UtteranceChannel(self.push, self.interrupt, self.emit)

    def push(self, pcm48, placed) -> None:
        at, self.head = self.head, self.head + pcm48.size
        placed(at)

    def interrupt(self) -> None:
        self.channel.cut(self.channel.position)

    def emit(self, text: str) -> None:
        self.sent.append(json.loads(text))

    def silence(self, samples: int) -> None:
        self.channel.silence_inserted(self.head, samples)
        self.head += samples

    def play_to(self, position: int) -> None:
        for p in range(self.channel.position, position + 1, OUTPUT_SAMPLES_PER_PACKET):
            self.channel.played(p)
        self.channel.played(position)


def start(t: Timeline, uid: str, rate: int = 16_000, channels: int = 1) -> None:
    t.channel.handle_message(
        {"type": "utterance_start", "id": uid, "sample_rate": rate, "num_channels": channels}
    )


def test_positions_leave_out_inserted_silence_and_each_utterance_finishes_once():
    t = Timeline()
    start(t, "a")
    t.channel.handle_audio(np.ones(8000, np.int16).tobytes())  # 0.5 s at 16 kHz
    t.silence(RATE // 4)  # the TTS stalled: the session put 0.25 s in
    t.channel.handle_audio(np.ones(8000, np.int16).tobytes())
    t.channel.handle_message({"type": "utterance_end", "id": "a"})
    start(t, "b", rate=8000, channels=2)
    t.channel.handle_audio(np.ones((4000, 2), np.int16).tobytes())
    t.channel.handle_message({"type": "utterance_end", "id": "b"})
    start(t, "c")
    t.channel.handle_audio(np.ones(16000, np.int16).tobytes())
    t.play_to(t.head)
    finished = [m for m in t.sent if m["type"] == "playback_finished"]
    assert [(m["id"], m["playback_position"], m["interrupted"]) for m in finished] == [
        ("a", 1.0, False),
        ("b", 0.5, False),
    ]  # c is still open: not finished, however much of it played
    t.channel.clear()
    assert t.sent[-1]["id"] == "c" and t.sent[-1]["interrupted"] is True
    with pytest.raises(BadRequest, match="already finished"):
        t.channel.clear("a")
    t.channel.handle_audio(np.ones(160, np.int16).tobytes())  # the rest of a cleared one
    start(t, "d")  # supersedes the cleared, still open c
    t.channel.handle_message({"type": "clear_buffer", "id": "d"})
    kinds = [(m["type"], m["id"]) for m in t.sent if m["type"].startswith("playback")]
    assert kinds.count(("playback_finished", "c")) == 1
    assert ("playback_started", "d") not in kinds and kinds[-1] == ("playback_finished", "d")
    assert t.sent[-1]["playback_position"] == 0


def test_a_stream_that_never_ends_times_out():
    t = Timeline()
    t.channel.idle_timeout_s = 0.2
    start(t, "a")
    t.channel.handle_audio(np.ones(1600, np.int16).tobytes())
    t.channel.tick(time.monotonic())
    assert not t.sent
    t.channel.tick(time.monotonic() + 0.5)
    assert t.sent[0]["type"] == "error" and "no utterance_end" in t.sent[0]["message"]
    t.play_to(t.head)
    assert t.sent[-1]["type"] == "playback_finished" and t.sent[-1]["playback_position"] == 0.1
