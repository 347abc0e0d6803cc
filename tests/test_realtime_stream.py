"""A real aiortc client over loopback talks to the real server and engine (tiny, CPU)."""

from __future__ import annotations

import asyncio

import aiohttp
import av
import numpy as np
import pytest
from support.realtime import REAL_TIME_ON_A_SHARED_CPU, make_speech_wav, running_server

from facecast_client import FacecastClient, PcmSource
from facecast_client.call import call_stats
from realtime.service import SERVICE

# Seconds of speech over WebRTC through the real server.
pytestmark = pytest.mark.slow

PLAN = [0.6, "Hello there, how are you today?", 1.0, "The quick brown fox jumps.", 0.8]


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    return make_speech_wav(tmp_path_factory.mktemp("wav") / "speech.wav", PLAN)


class RecordingSink:
    """Stands where the KVS mirror plugs in: sees exactly what the peer is sent."""

    def __init__(self) -> None:
        self.video: list[int] = []
        self.audio: list[int] = []
        self.closed = False

    def put_video(self, frame_rgb, index):
        assert frame_rgb.dtype == np.uint8 and frame_rgb.ndim == 3
        self.video.append(index)

    def put_audio(self, pcm_s16_48k, sample_index):
        assert pcm_s16_48k.dtype == np.int16 and pcm_s16_48k.size == 960
        self.audio.append(sample_index)

    async def close(self):
        self.closed = True


@pytest.mark.timeout(120)
@REAL_TIME_ON_A_SHARED_CPU
async def test_stream_frames_sync_vad_and_metrics(speech, tmp_path):
    mp4 = tmp_path / "call.mp4"
    sink = RecordingSink()

    async def attach(session):
        return sink

    async with running_server(sink_factories=[attach]) as (url, app):
        client = FacecastClient(
            url, PcmSource.from_wav(speech.path), keep_frames=True, record_to=mp4
        )
        await client.connect()
        await client.wait_frames(1, timeout=30)
        first = client.received.video_arrival[0]
        await asyncio.sleep(speech.duration + 1.5)
        live = [s.describe() for s in app[SERVICE].sessions.values()]
        async with aiohttp.ClientSession() as http:
            metrics = await (await http.get(f"{url}/metrics")).text()
            listed = (await (await http.get(f"{url}/sessions")).json())["sessions"]
        assert [s["id"] for s in listed] == [client.session_id] and listed[0]["frames_sent"] > 0
        await client.close()
        stats = call_stats(client)

    rec = client.received
    # Cadence: ≥ 95% of the frames 25 fps promises between the first and last arrival.
    span = rec.video_arrival[-1] - first
    expected = span * 25 + 1
    assert len(rec.video_pts) >= 0.95 * expected, (len(rec.video_pts), expected, live)
    steps = np.diff(rec.video_pts)
    assert np.all(steps % 3600 == 0) and np.all(steps > 0), "pts = n·3600, increasing"
    assert np.mean(steps == 3600) >= 0.95, "only a stalled sender may skip a deadline"
    assert stats["ttff_ms"] > 0 and stats["ttff_ms"] < 15_000
    # A/V offset by timestamps: the returned speech sits where the video made from it is.
    assert abs(stats["av_offset_ms"]) <= 40, stats
    # The avatar moves: frames differ over time (not one frozen picture).
    frames = np.stack(rec.frames).astype(np.int16)
    distinct = {f.tobytes() for f in rec.frames}
    assert len(distinct) >= 0.1 * len(rec.frames), (len(distinct), live)
    assert np.abs(frames[-1] - frames[0]).mean() > 1.0
    # Speech segments were seen by the VAD on the server, close to the true edges.
    starts = [e["at_ms"] for e in client.events if e["type"] == "speech_started"]
    stops = [e["at_ms"] for e in client.events if e["type"] == "speech_stopped"]
    assert len(starts) == len(stops) == len(speech.segments), client.events
    # edges are on the session's timeline: the input plus silence the server inserted
    # (while nobody spoke) to grow its playout delay to the budget
    grown = [e for e in client.events if e["type"] == "delay_grown"]
    assert grown and grown[0]["at_ms"] < speech.segments[0][0] * 1000, grown

    def shift(at_ms):
        return sum(g["added_ms"] for g in grown if g["at_ms"] <= at_ms)

    for (t0, t1), s, e in zip(speech.segments, starts, stops, strict=True):
        s, e = s - shift(s), e - shift(e)
        assert abs(s - t0 * 1000) <= 100 and abs(e - t1 * 1000) <= 100, (
            speech.segments,
            starts,
            stops,
        )
    # Playback events come in order, one pair per segment, after the matching VAD event.
    kinds = [e["type"] for e in client.events if e["type"].startswith("playback")]
    assert kinds == ["playback_started", "playback_finished"] * len(speech.segments)
    # Metrics exported.
    for name in (
        "facecast_active_sessions",
        "facecast_time_to_first_frame_seconds_count 1.0",
        "facecast_generation_realtime_factor",
        "facecast_video_frames_repeated_total",
        "facecast_video_frames_dropped_total",
        "facecast_video_queue_depth_frames",
        'facecast_vad_transitions_total{transition="speech_started"} 2.0',
    ):
        assert name in metrics
    # The mirror hook saw the same media the peer got, on the same clock.
    assert sink.closed and sink.video[: len(rec.video_pts)] == list(range(len(rec.video_pts)))
    assert sink.audio[:100] == [k * 960 for k in range(100)]
    # The recording is a playable MP4 with both streams.
    with av.open(str(mp4)) as box:
        assert box.streams.video and box.streams.audio
        assert sum(1 for _ in box.decode(video=0)) >= 0.9 * len(rec.video_pts)
    print("stream stats", stats, live)
