"""`facecast serve --kvs-stream` wiring: each session is mirrored through the sink hook,
to the stream its offer names (fake PutMedia endpoint, moto control plane)."""

from __future__ import annotations

import asyncio

import pytest
from support.kvs import AWS_TEST_KEY, AWS_TEST_SECRET, FakeKvsEndpoint
from support.realtime import make_speech_wav, running_server

from facecast_client import FacecastClient, PcmSource
from realtime.kvs import KvsOptions
from realtime.service import SERVICE

# A served call mirrored to KVS for seconds.
pytestmark = pytest.mark.slow

KEY, SECRET, REGION = AWS_TEST_KEY, AWS_TEST_SECRET, "us-east-2"


@pytest.mark.timeout(120)
async def test_served_session_is_mirrored_to_the_offers_stream(aws, tmp_path):
    speech = make_speech_wav(tmp_path / "s.wav", [0.3, "Hello there, how are you?", 0.3])
    endpoint = FakeKvsEndpoint(KEY, SECRET, REGION)
    await endpoint.start()
    options = KvsOptions(
        stream="facecast",
        region=REGION,
        create=True,
        endpoint_url=endpoint.url,
        fragment_s=1.0,
        retry_buffer_s=3.0,
    )
    try:
        async with running_server(kvs=options) as (url, app):
            client = FacecastClient(
                url, PcmSource.from_wav(speech.path), offer_options={"kvs_stream": "lobby"}
            )
            await client.connect()
            session = app[SERVICE].sessions[client.session_id]
            mirror = session.sinks[0]
            await client.wait_frames(1, timeout=60)
            await asyncio.sleep(4.0)
            await client.close()  # closes the session, which closes (flushes) the mirror
        assert mirror.stream_name == "lobby" and mirror.state == "closed"
        assert mirror.stats.fragments_persisted >= 3
        assert len(endpoint.fragments("lobby")) == mirror.stats.fragments_persisted
    finally:
        await endpoint.stop()
