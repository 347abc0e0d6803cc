"""The KVS mirror never slows the WebRTC path: a real aiortc client gets the same frame
rate from the real server with the mirror off, on, and failing.

The mirror is attached the way the server will attach it: as a sink of the session's
paced tracks (`session.sinks`), receiving exactly the frames and audio sent to the peer.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from support.kvs import AWS_TEST_KEY, AWS_TEST_SECRET, FakeKvsEndpoint
from support.realtime import REAL_TIME_ON_A_SHARED_CPU, running_server

from facecast_client import FacecastClient, PcmSource
from realtime.kvs import KvsMirror, KvsOptions
from realtime.service import SERVICE

KEY, SECRET, REGION = AWS_TEST_KEY, AWS_TEST_SECRET, "us-east-2"
CALL_S = 8.0


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 48_000)) / 48_000
    return (np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * t)) * 9000).astype(
        np.int16
    )


class TimedSink:
    """Passes the session's media to the mirror and times each hand-over (the only cost
    the WebRTC path pays for mirroring)."""

    def __init__(self, mirror: KvsMirror) -> None:
        self.mirror = mirror
        self.costs: list[float] = []

    def put_video(self, frame: np.ndarray, index: int) -> None:
        start = time.perf_counter()
        self.mirror.put_video(frame, index)
        self.costs.append(time.perf_counter() - start)

    def put_audio(self, pcm: np.ndarray, sample_index: int) -> None:
        start = time.perf_counter()
        self.mirror.put_audio(pcm, sample_index)
        self.costs.append(time.perf_counter() - start)

    async def close(self) -> None:
        await self.mirror.close()


def delivered_fps(pts: list[int]) -> float:
    """Frames received per second of stream time. The server's tracks skip a deadline when
    they could not send in time (a busy loop, a starved CPU); skips show as pts gaps, while
    network jitter, which only moves arrival times, does not count."""
    return (len(pts) - 1) / ((pts[-1] - pts[0]) / 90_000)


async def call(kvs: FakeKvsEndpoint | None) -> tuple[float, dict, TimedSink | None]:
    """One call of CALL_S seconds of video; returns the client's fps, session info, sink."""
    sink = None
    async with running_server() as (url, app):
        service = app[SERVICE]
        client = FacecastClient(url, PcmSource(tone(CALL_S + 8)))
        await client.connect()
        session = service.sessions[client.session_id]
        if kvs is not None:
            options = KvsOptions(
                stream="call",
                region=REGION,
                create=True,
                endpoint_url=kvs.url,
                fragment_s=1.0,
                retry_buffer_s=3.0,
                backoff_initial_s=0.1,
                backoff_max_s=0.5,
            )
            width, height = service.video_size()
            mirror = KvsMirror(
                options, "call", width, height, fps=25, registry=service.metrics.registry
            )
            await mirror.start()
            sink = TimedSink(mirror)
            session.sinks.append(sink)
        await client.wait_frames(1, timeout=60)
        await asyncio.sleep(CALL_S)
        info = session.describe()
        await client.close()
        if sink is not None:
            await sink.close()
    return delivered_fps(client.received.video_pts), info, sink


@pytest.mark.slow
@pytest.mark.timeout(300)
@REAL_TIME_ON_A_SHARED_CPU
async def test_client_frame_rate_is_the_same_with_the_mirror_off_on_and_failing(aws):
    off, off_info, _ = await call(None)

    healthy = FakeKvsEndpoint(KEY, SECRET, REGION)
    await healthy.start()
    try:
        on, on_info, sink_on = await call(healthy)
    finally:
        await healthy.stop()

    down = FakeKvsEndpoint(KEY, SECRET, REGION)
    down.fail_requests(503, count=10**6)  # KVS unavailable for the whole call
    await down.start()
    try:
        failing, failing_info, sink_failing = await call(down)
    finally:
        await down.stop()

    rates = {"off": off, "on": on, "failing": failing}
    repeated = [i["frames_repeated"] for i in (off_info, on_info, failing_info)]
    print("client fps", rates, "frames repeated by the server", repeated)
    # Other processes share this CPU; under load any call may skip a few deadlines.
    for name, fps in rates.items():
        assert fps == pytest.approx(25.0, abs=1.0), (name, rates)
    assert abs(on - off) <= 1.0 and abs(failing - off) <= 1.0, rates
    # What mirroring costs the WebRTC path per frame or audio chunk: a queue put.
    for sink in (sink_on, sink_failing):
        assert np.median(sink.costs) < 0.0005, np.percentile(sink.costs, [50, 99])
    # The mirror really worked, and really failed, while the calls ran.
    mirror_on, mirror_failing = sink_on.mirror, sink_failing.mirror
    assert mirror_on.stats.fragments_persisted >= CALL_S - 2
    assert len(healthy.fragments("call")) == mirror_on.stats.fragments_persisted
    assert mirror_failing.stats.errors["http_503"] >= 2
    assert mirror_failing.stats.fragments_persisted == 0
