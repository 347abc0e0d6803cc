"""The KVS mirror end to end: moto for the control plane, the fake PutMedia endpoint for
the data plane, real PyAV encoding, real HTTP over loopback, real SigV4. The runs that
stream for seconds are `slow`; the quick failures stay in `make test-fast`."""

from __future__ import annotations

import asyncio
import io

import av
import pytest
from prometheus_client import CollectorRegistry
from support.kvs import (
    FPS,
    KEY,
    REGION,
    SECRET,
    FakeKvsEndpoint,
    assert_clean_timeline,
    feed,
    options,
)

from realtime.kvs import KvsMirror
from realtime.kvs.control import clear_client_cache
from realtime.kvs.putmedia import ACK_ERRORS, RETRY_CODES, STREAM_FATAL_CODES


@pytest.fixture
async def kvs(aws):
    endpoint = FakeKvsEndpoint(KEY, SECRET, REGION, persist_delay_s=0.05)
    await endpoint.start()
    yield endpoint
    await endpoint.stop()


def decoded(data: bytes) -> tuple[int, float]:
    with av.open(io.BytesIO(data), format="matroska") as box:
        frames = sum(1 for _ in box.decode(video=0))
    with av.open(io.BytesIO(data), format="matroska") as box:
        seconds = sum(f.samples for f in box.decode(audio=0)) / 48_000
    return frames, seconds


@pytest.mark.slow
async def test_twenty_seconds_mirrored_as_valid_fragments(kvs):
    registry = CollectorRegistry()
    mirror = KvsMirror(options(kvs), "show", 64, 64, fps=FPS, registry=registry)
    await mirror.start()
    await feed(mirror, frames=520, speed=10)  # 20.8 s of media in about 2 s
    stats = await mirror.close()

    assert mirror.state == "closed"
    assert (stats.fragments_encoded, stats.fragments_persisted) == (11, 11)
    assert stats.fragments_failed == stats.fragments_retried == stats.input_dropped == 0
    assert_clean_timeline(kvs, "show", 2000, 11)
    request = kvs.requests[0]
    assert (request.status, request.auth_error, request.end) == (200, None, "eof")
    arrivals = [f.arrived_at for f in kvs.fragments("show")]
    busiest = max(sum(1 for t in arrivals if a <= t < a + 1.0) for a in arrivals)
    assert busiest <= 5, "at most 5 fragments per second"
    frames, seconds = decoded(kvs.mkv("show"))
    assert frames == 520
    assert seconds == pytest.approx(520 / FPS, abs=0.05)
    value = registry.get_sample_value
    assert value("facecast_kvs_fragments_persisted_total") == 11
    assert value("facecast_kvs_fragments_sent_total") == 11
    assert value("facecast_kvs_ack_latency_seconds_count") == 11


@pytest.mark.slow
async def test_a_dropped_connection_leaves_no_gap_and_no_duplicate(aws, caplog):
    # Slow persisting, so fragments RECEIVED but not yet PERSISTED are cut off too.
    kvs = FakeKvsEndpoint(KEY, SECRET, REGION, persist_delay_s=0.3)
    await kvs.start()
    kvs.disconnect_at(8000)
    try:
        mirror = KvsMirror(options(kvs), "show", 64, 64, fps=FPS)
        await mirror.start()
        await feed(mirror, frames=520, speed=10)
        stats = await mirror.close()
    finally:
        await kvs.stop()
    assert len(kvs.requests) == 2 and stats.errors["disconnect"] == 1
    assert stats.fragments_retried >= 1  # 8000 at least, plus any not yet persisted
    assert_clean_timeline(kvs, "show", 2000, 11)
    assert decoded(kvs.mkv("show"))[0] == 520
    assert "reconnecting" in caplog.text


# One code of each kind (resent, fatal to the stream, fragment dropped) in the fast loop;
# most of the others wait out the 5 fragments/s limit for a second each.
ONE_OF_EACH_KIND = {4000, 4500, 4001}


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(c, marks=[] if c in ONE_OF_EACH_KIND else [pytest.mark.slow])
        for c in sorted(ACK_ERRORS)
    ],
)
async def test_error_acks_are_logged_counted_and_survived(kvs, caplog, code):
    kvs.error_at(800, code)
    mirror = KvsMirror(options(kvs, fragment_s=0.4), "show", 64, 64, fps=FPS)
    await mirror.start()
    await feed(mirror, frames=60, speed=10)  # six 0.4 s fragments
    stats = await mirror.close()

    assert stats.errors[f"ack_{code}"] == 1
    assert f"ERROR {code} {ACK_ERRORS[code]}" in caplog.text
    timecodes = [f.timecode for f in kvs.fragments("show")]
    assert kvs.duplicates == []
    if code in RETRY_CODES:  # resent on a new connection: nothing lost
        assert timecodes == [0, 400, 800, 1200, 1600, 2000]
        assert stats.fragments_failed == 0 and mirror.state == "closed"
    elif code in STREAM_FATAL_CODES:  # nothing more can be written to this stream
        assert mirror.state == "failed" and "mirroring stopped" in caplog.text
        assert timecodes == [0, 400]
    else:  # that fragment as sent is bad: it alone is dropped
        assert timecodes == [0, 400, 1200, 1600, 2000]
        assert stats.fragments_failed == 1 and mirror.state == "closed"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "error_type", "kind"),
    [
        (500, "InternalFailure", "http_500"),
        (503, "ServiceUnavailable", "http_503"),
        (400, "ClientLimitExceededException", "throttled"),
    ],
)
async def test_http_errors_and_throttling_back_off_and_retry(kvs, status, error_type, kind):
    kvs.fail_requests(status, count=2, error_type=error_type)
    mirror = KvsMirror(options(kvs, fragment_s=0.4), "show", 64, 64, fps=FPS)
    await mirror.start()
    await feed(mirror, frames=60, speed=10)
    stats = await mirror.close()
    assert stats.errors[kind] == 2 and len(kvs.requests) == 3
    assert_clean_timeline(kvs, "show", 400, 6)


async def test_wrong_credentials_stop_the_mirror_not_the_session(aws, caplog):
    kvs = FakeKvsEndpoint(KEY, "another-secret", REGION)  # our signature will not match
    await kvs.start()
    try:
        mirror = KvsMirror(options(kvs, fragment_s=0.4), "show", 64, 64, fps=FPS)
        await mirror.start()
        await feed(mirror, frames=60, speed=10)
        stats = await mirror.close()
    finally:
        await kvs.stop()
    assert kvs.requests[0].auth_error == "signature mismatch"
    assert mirror.state == "failed" and stats.errors["access_denied"] == 3
    assert "mirroring stopped (the session goes on)" in caplog.text


async def test_unknown_stream_without_create(kvs, caplog):
    mirror = KvsMirror(options(kvs, create=False), "nowhere", 64, 64, fps=FPS)
    await mirror.start()
    await feed(mirror, frames=30, speed=10)
    stats = await mirror.close()
    assert mirror.state == "failed" and stats.errors["stream_not_found"] == 1
    assert "pass --kvs-create" in caplog.text
    assert kvs.requests == []


async def test_no_credentials(kvs, monkeypatch, caplog):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    clear_client_cache()
    mirror = KvsMirror(options(kvs), "show", 64, 64, fps=FPS)
    await mirror.start()
    await feed(mirror, frames=30, speed=10)
    stats = await mirror.close()
    assert mirror.state == "failed" and stats.errors["no_credentials"] == 1
    assert "no AWS credentials" in caplog.text


@pytest.mark.slow
async def test_retry_buffer_is_bounded_and_says_so(kvs, caplog):
    kvs.fail_requests(503, count=10_000)  # KVS down for the whole test
    mirror = KvsMirror(options(kvs, fragment_s=0.4, retry_buffer_s=1.2), "show", 64, 64, fps=FPS)
    await mirror.start()
    await feed(mirror, frames=100, speed=10)  # ten fragments, room for three
    for _ in range(400):  # the encoder thread can lag behind a busy CPU
        if mirror.stats.fragments_encoded >= 9:
            break
        await asyncio.sleep(0.05)
    encoded = mirror.stats.fragments_encoded
    stats = await mirror.close(timeout=0.5)
    # everything beyond the three fragments the buffer holds was evicted, and said so
    assert encoded >= 9 and stats.fragments_overflowed >= encoded - 3
    assert "retry buffer full" in caplog.text
    assert kvs.fragments("show") == []


@pytest.mark.slow
async def test_pauses_keep_the_stream_alive_with_idle_video_and_silence(aws):
    # A short no-data timeout stands in for KVS's 30 s; IDLE acks come meanwhile.
    kvs = FakeKvsEndpoint(KEY, SECRET, REGION, idle_ack_s=0.3, no_data_timeout_s=1.5)
    await kvs.start()
    try:
        mirror = KvsMirror(
            options(kvs, fragment_s=0.4, idle_fill_after_s=0.3), "show", 64, 64, fps=FPS
        )
        await mirror.start()
        await feed(mirror, frames=25, speed=1.0)
        await asyncio.sleep(2.5)  # the session sends nothing (no viewer pulling frames)
        await feed(mirror, frames=25, speed=1.0, first=25)
        stats = await mirror.close()
    finally:
        await kvs.stop()
    assert len(kvs.requests) == 1, "the connection never hit the no-data timeout"
    assert stats.filled_frames >= 40
    fragments = kvs.fragments("show")
    assert [f.timecode for f in fragments] == [400 * k for k in range(len(fragments))]
    assert kvs.duplicates == []


@pytest.mark.slow
async def test_connections_rotate_to_a_fresh_endpoint_without_gaps(kvs):
    # endpoint_refresh_s stands in for the 45 minutes after which the endpoint is renewed.
    mirror = KvsMirror(
        options(kvs, fragment_s=0.4, endpoint_refresh_s=0.5), "show", 64, 64, fps=FPS
    )
    await mirror.start()
    await feed(mirror, frames=100, speed=1.0)  # 4 s, in real time
    stats = await mirror.close()
    assert stats.connections >= 3 and stats.fragments_failed == 0
    assert not stats.errors
    assert_clean_timeline(kvs, "show", 400, 10)
