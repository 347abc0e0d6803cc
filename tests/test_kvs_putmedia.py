"""PutMedia request signing and acknowledgement parsing, against the fake endpoint's checks."""

from __future__ import annotations

import aiohttp
import botocore.credentials
import pytest
from support.kvs import FakeKvsEndpoint

from realtime.kvs.putmedia import parse_ack, signed_headers

KEY, SECRET, REGION = "AKIDKVSTEST", "kvs-test-secret", "ap-northeast-1"


@pytest.fixture
async def kvs():
    endpoint = FakeKvsEndpoint(KEY, SECRET, REGION, streams={"show"})
    await endpoint.start()
    yield endpoint
    await endpoint.stop()


def headers(url: str, secret: str = SECRET, token: str | None = None) -> dict[str, str]:
    credentials = botocore.credentials.ReadOnlyCredentials(KEY, secret, token)
    return signed_headers(f"{url}/putMedia", "show", 1_700_000_000.25, credentials, REGION)


async def post(url: str, request_headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/putMedia", data=b"", headers=request_headers) as response:
            return response.status, await response.text()


def test_signed_headers_carry_what_putmedia_needs():
    h = headers("https://abc.kinesisvideo.us-east-1.amazonaws.com")
    assert h["x-amzn-stream-name"] == "show"
    assert h["x-amzn-fragment-timecode-type"] == "RELATIVE"
    assert h["x-amzn-producer-start-timestamp"] == "1700000000.250"
    assert h["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"  # the body is an open stream
    assert h["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY}/")
    assert f"/{REGION}/kinesisvideo/aws4_request" in h["Authorization"]
    assert SECRET not in str(h)
    with_token = headers("https://x.example", token="session-token")
    assert with_token["X-Amz-Security-Token"] == "session-token"
    assert "x-amz-security-token" in with_token["Authorization"]


async def test_the_endpoint_accepts_a_good_signature_and_refuses_tampering(kvs):
    status, _ = await post(kvs.url, headers(kvs.url))
    assert status == 200 and kvs.requests[-1].auth_error is None

    status, body = await post(kvs.url, headers(kvs.url, secret="wrong"))
    assert status == 403 and "signature mismatch" in body

    tampered = headers(kvs.url)
    tampered["x-amzn-stream-name"] = "other"  # signed header changed after signing
    assert (await post(kvs.url, tampered))[0] == 403

    missing = headers(kvs.url)
    del missing["x-amzn-producer-start-timestamp"]
    status, body = await post(kvs.url, missing)
    assert status == 400 and "x-amzn-producer-start-timestamp" in body


async def test_unknown_stream_is_404(kvs):
    credentials = botocore.credentials.ReadOnlyCredentials(KEY, SECRET, None)
    h = signed_headers(f"{kvs.url}/putMedia", "nope", 1.0, credentials, REGION)
    assert (await post(kvs.url, h))[0] == 404


def test_acks_parse_in_the_shapes_kvs_sends():
    persisted = parse_ack(
        b'{"EventType":"PERSISTED","FragmentTimecode":12000,'
        b'"FragmentNumber":"91343852333181432392682062607743920146264"}\n'
    )
    assert persisted.event_type == "PERSISTED" and persisted.timecode == 12000
    error = parse_ack(
        b'{"EventType":"ERROR","FragmentTimecode":4000,"FragmentNumber":"1",'
        b'"ErrorId":4011,"ErrorCode":"FRAMES_MISSING_FOR_TRACK"}'
    )
    assert (error.error_id, error.error_name) == (4011, "FRAMES_MISSING_FOR_TRACK")
    assert parse_ack(b'{"EventType":"IDLE"}').timecode is None
    assert parse_ack(b"\n") is None and parse_ack(b"not json") is None
    wrapped = parse_ack(b'{"Acknowledgement":{"EventType":"ERROR","ErrorId":5000}}')
    assert wrapped.error_name == "INTERNAL_ERROR"
