"""A session as a chain of parts: one interrupt path through all of them, closing in order.

The session runs in this process on a scripted engine (its steps sleep, so the machine's
load does not change them), with a peer connection that is never negotiated: its tracks
are read here, as the Pipecat integration reads them, and the agent speaks through
utterances, as it does over the data channel.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamError
from support.realtime import ScriptedEngine, wait_until

from pipeline.clock import OUTPUT_RATE, OUTPUT_SAMPLES_PER_FRAME
from realtime.control import Interrupt
from realtime.engine_timing import EngineTiming
from realtime.metrics import RealtimeMetrics
from realtime.session import PeerSession
from realtime.session_config import SessionConfig
from realtime.vad import VoiceActivityDetector


async def _pull(track) -> None:
    try:
        while True:
            await track.recv()  # paced by the track: one frame per deadline
    except MediaStreamError:
        return


async def _open_session(events: list[dict]) -> tuple[PeerSession, list[asyncio.Task]]:
    engine = ScriptedEngine(rtf=0.3)

    async def closed(session: PeerSession) -> None:
        events.append({"type": "_on_closed"})

    session = PeerSession(
        "test-session-chain",
        RTCPeerConnection(),
        lambda seed: engine.new_stream(None, seed=seed),
        (32, 32),
        SessionConfig(),
        RealtimeMetrics(),
        closed,
        await asyncio.to_thread(VoiceActivityDetector),
        EngineTiming.of(engine),
    )
    session.listeners.append(lambda text: events.append(json.loads(text)))
    session.start()  # no microphone: it idles until the first utterance
    pulls = [asyncio.ensure_future(_pull(t)) for t in (session.video, session.audio)]
    return session, pulls


def _say(session: PeerSession, uid: str, seconds: float) -> None:
    rate = 16_000
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * 32767 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()
    reply = lambda text: pytest.fail(text)  # noqa: E731
    start = {"type": "utterance_start", "id": uid, "sample_rate": rate, "num_channels": 1}
    session.handle_message(json.dumps(start), reply)
    for i in range(0, len(pcm), 32_000):
        session.handle_message(pcm[i : i + 32_000], reply)
    session.handle_message(json.dumps({"type": "utterance_end", "id": uid}), reply)


@pytest.mark.timeout(60)
async def test_an_interrupt_passes_every_part_once_in_order_and_the_played_position_is_exact():
    events: list[dict] = []
    session, pulls = await _open_session(events)
    try:
        await wait_until(lambda: session.video.sent > 5, 20)  # idle on screen
        _say(session, "u1", 4.0)
        await wait_until(lambda: any(e["type"] == "playback_started" for e in events), 20)
        await asyncio.sleep(0.5)  # some of it said

        seen: list[tuple[str, Interrupt]] = []
        chain = {
            "control": session.control,
            "playout": session.playout,
            "feed": session.feed,
            "audio_in": session.audio_in,
            "tracks": session.tracks,
        }
        for name, part in chain.items():
            flush = part.interrupt

            def spy(cut: Interrupt, name: str = name, flush=flush) -> None:
                seen.append((name, cut))
                flush(cut)

            part.interrupt = spy  # type: ignore[method-assign]
        truncated: list[int] = []
        truncate = session.frames.truncate
        session.frames.truncate = lambda index: truncated.append(index) or truncate(index)  # type: ignore[method-assign]
        utterance = session.speech.queue[0]
        played_ms = session.interrupt()

        assert [name for name, _ in seen] == list(chain), "each part once, in chain order"
        cut = seen[0][1]
        assert all(c is cut for _, c in seen), "one message through the chain"
        # exact: what the audio track had sent of the utterance when the interrupt came
        assert utterance.start is not None and cut.position > utterance.start
        expected = round((cut.position - utterance.start) * 1000 / OUTPUT_RATE)
        assert played_ms == cut.played_ms == expected
        finished = [e for e in events if e["type"] == "playback_finished"]
        assert finished[-1]["interrupted"] is True
        assert round(finished[-1]["playback_position"] * 1000) == played_ms
        assert events[-1] == {"type": "interrupted", "played_ms": played_ms}
        # each part did its own flush
        assert session.last_interrupt == (cut.now, cut.cut, cut.new_audio)
        assert cut.now <= cut.cut <= cut.now + cut.tail
        assert truncated == [cut.cut], "queued frames dropped from the cut on"
        muted = session.audio_in.timeline.read(cut.position, cut.head - cut.position)
        assert cut.head > cut.position and not muted.any(), "the flushed speech is not said"
        assert (
            session.audio_in.timeline.head == cut.head == cut.new_audio * OUTPUT_SAMPLES_PER_FRAME
        )
        assert not session.speech.queue
    finally:
        await session.close()
        await asyncio.gather(*pulls)


@pytest.mark.timeout(60)
async def test_closing_a_session_stops_then_closes_its_parts_in_order():
    events: list[dict] = []
    session, pulls = await _open_session(events)
    calls: list[str] = []
    for part in session._parts:
        stop, close = part.stop, part.close
        name = type(part).__name__

        def stop_spy(stop=stop, name=name) -> None:
            calls.append(f"stop {name}")
            stop()

        async def close_spy(close=close, name=name) -> None:
            calls.append(f"close {name}")
            await close()

        part.stop, part.close = stop_spy, close_spy  # type: ignore[method-assign]
    await wait_until(lambda: session.video.sent > 5, 20)
    await session.close("done")
    await asyncio.gather(*pulls)

    names = [type(p).__name__ for p in session._parts]
    assert calls == [f"stop {n}" for n in names] + [f"close {n}" for n in names]
    assert names[0] == "AudioIn" and names[-1] == "ControlChannel"
    kinds = [e["type"] for e in events]
    assert kinds.index("session_closed") < kinds.index("_on_closed")
    assert session.worker.exited.is_set(), "the generation thread ended"
    vad_thread = session.audio_in.vad._thread
    await asyncio.to_thread(vad_thread.join, 2.0)
    assert not vad_thread.is_alive(), "the VAD thread ended"
    assert all(t.done() for t in session.tasks)
    assert session.pc.connectionState == "closed"
