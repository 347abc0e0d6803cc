"""The PutMedia data plane: one long-running, chunked, SigV4-signed POST and its acks.

boto3 has no PutMedia, so the request is built here: botocore signs it (service
`kinesisvideo`, payload `UNSIGNED-PAYLOAD` as the AWS producer SDKs do, since the body is
an open-ended stream) and aiohttp streams the body while the acknowledgements (newline
separated JSON) are read from the same response.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urlsplit

import aiohttp
import botocore.auth
import botocore.awsrequest
import botocore.credentials

from realtime.kvs.errors import PutMediaConnectionLost, PutMediaHttpError

log = logging.getLogger(__name__)

SERVICE = "kinesisvideo"
TIMECODE_TYPE = "RELATIVE"  # cluster timecodes count from x-amzn-producer-start-timestamp

# ERROR acknowledgement codes (PutMedia API reference).
ACK_ERRORS = {
    4000: "STREAM_READ_ERROR",
    4001: "MAX_FRAGMENT_SIZE_REACHED",
    4002: "MAX_FRAGMENT_DURATION_REACHED",
    4003: "MAX_CONNECTION_DURATION_REACHED",
    4004: "FRAGMENT_TIMECODE_LESSER_THAN_PREVIOUS",
    4005: "MORE_THAN_ALLOWED_TRACKS_FOUND",
    4006: "INVALID_MKV_DATA",
    4007: "INVALID_PRODUCER_TIMESTAMP",
    4008: "STREAM_NOT_ACTIVE",
    4009: "FRAGMENT_METADATA_LIMIT_REACHED",
    4010: "TRACK_NUMBER_MISMATCH",
    4011: "FRAMES_MISSING_FOR_TRACK",
    4012: "MORE_THAN_ALLOWED_TRACKS_FOUND",
    4500: "KMS_KEY_ACCESS_DENIED",
    4501: "KMS_KEY_DISABLED",
    4502: "KMS_KEY_VALIDATION_ERROR",
    4503: "KMS_KEY_UNAVAILABLE",
    4504: "KMS_KEY_INVALID_USAGE",
    4505: "KMS_KEY_INVALID_STATE",
    4506: "KMS_KEY_NOT_FOUND",
    5000: "INTERNAL_ERROR",
    5001: "ARCHIVAL_ERROR",
}
# What to do about each: resend the same bytes later, give up on that fragment, or stop.
RETRY_CODES = {4000, 4003, 5000, 5001}
STREAM_FATAL_CODES = {4007, 4008} | set(range(4500, 4507))
# Everything else (4001, 4002, 4004-4006, 4009-4012) means that fragment is bad as sent.


@dataclass(frozen=True)
class Ack:
    event_type: str  # BUFFERING, RECEIVED, PERSISTED, ERROR, IDLE
    timecode: int | None = None
    fragment_number: str | None = None
    error_id: int | None = None
    error_code: str | None = None

    @property
    def error_name(self) -> str:
        return self.error_code or ACK_ERRORS.get(self.error_id or 0, "UNKNOWN_ERROR")


def parse_ack(line: bytes) -> Ack | None:
    """One acknowledgement line; None for blank lines and anything that is not an ack."""
    line = line.strip()
    if not line:
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        log.warning("ignoring a PutMedia ack line that is not JSON: %r", line[:200])
        return None
    if isinstance(doc, dict) and isinstance(doc.get("Acknowledgement"), dict):
        doc = doc["Acknowledgement"]
    if not isinstance(doc, dict) or "EventType" not in doc:
        return None
    error_id = doc.get("ErrorId")
    return Ack(
        event_type=str(doc["EventType"]).upper(),
        timecode=int(doc["FragmentTimecode"]) if doc.get("FragmentTimecode") is not None else None,
        fragment_number=str(doc["FragmentNumber"]) if doc.get("FragmentNumber") else None,
        error_id=int(error_id) if error_id is not None else None,
        error_code=doc.get("ErrorCode"),
    )


def signed_headers(
    url: str,
    stream_name: str,
    producer_start_s: float,
    credentials: botocore.credentials.ReadOnlyCredentials,
    region: str,
) -> dict[str, str]:
    """Headers of a PutMedia request, SigV4-signed. Holds secrets: never log the result."""
    host = urlsplit(url).netloc
    request = botocore.awsrequest.AWSRequest(
        method="POST",
        url=url,
        headers={
            "Host": host,
            "x-amzn-stream-name": stream_name,
            "x-amzn-fragment-timecode-type": TIMECODE_TYPE,
            "x-amzn-producer-start-timestamp": f"{producer_start_s:.3f}",
        },
        data=b"",
    )
    request.context["payload_signing_enabled"] = False  # streaming body: UNSIGNED-PAYLOAD
    botocore.auth.SigV4Auth(credentials, SERVICE, region).add_auth(request)
    return dict(request.headers.items())


class PutMediaConnection:
    """One PutMedia request: `send` body bytes, iterate `acks()`, then `close`.

    With `dump`, every body chunk is also written there as it goes to the socket: the file
    holds exactly what this connection sent (the MKV header, then its clusters).
    """

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        headers: dict[str, str],
        dump: BinaryIO | None = None,
    ) -> None:
        self._http = http
        self._dump = dump
        self._url = url
        self._headers = headers
        # Two chunks of look-ahead: `send` waits when the socket does, so a stalled
        # connection holds at most this much beyond what the ledger keeps anyway.
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=2)
        self._response: aiohttp.ClientResponse | None = None

    async def open(self, first_chunk: bytes) -> None:
        """Start the request with `first_chunk` (the MKV header); raise unless HTTP 200."""
        await self._chunks.put(first_chunk)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=None)
        try:
            response = await self._http.post(
                self._url, data=self._body(), headers=self._headers, timeout=timeout
            )
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise PutMediaConnectionLost(f"cannot reach PutMedia endpoint: {exc!r}") from exc
        if response.status != 200:
            body = await _read_error_body(response)
            error_type = response.headers.get("x-amz-ErrorType", "").split(":")[0]
            response.close()
            raise PutMediaHttpError(response.status, error_type, body)
        self._response = response

    async def send(self, data: bytes) -> None:
        await self._chunks.put(data)

    async def end_body(self) -> None:
        """Finish the chunked body; acks keep coming until KVS closes the response."""
        await self._chunks.put(None)

    async def acks(self) -> AsyncIterator[Ack]:
        assert self._response is not None, "open() first"
        try:
            async for line in self._response.content:
                ack = parse_ack(line)
                if ack is not None:
                    yield ack
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise PutMediaConnectionLost(f"PutMedia connection dropped: {exc!r}") from exc

    def close(self) -> None:
        if self._response is not None:
            self._response.close()

    async def _body(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._chunks.get()
            if chunk is None:
                return
            if self._dump is not None:  # a debugging aid: a small blocking write is fine
                self._dump.write(chunk)
            yield chunk


async def _read_error_body(response: aiohttp.ClientResponse) -> str:
    try:
        text = await asyncio.wait_for(response.text(), timeout=5.0)
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        return ""
    try:
        doc = json.loads(text)
        return str(doc.get("message") or doc.get("Message") or text)[:300]
    except ValueError:
        return text[:300]
