"""The HTTP edge: malformed requests get JSON and one log line, incomplete ones are closed."""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlsplit

import aiohttp
import pytest
from support.realtime import raw_request, running_server, status_and_json

from realtime.security import SecurityConfig

FAST = SecurityConfig(header_timeout_s=0.5, body_timeout_s=0.5)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS sent to plain HTTP
        b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nBad Header\r\n\r\n",
        b"POST /offer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["tls", "version", "length", "long-header", "no-colon", "bad-chunk"],
)
async def test_malformed_http_gets_a_json_400_and_one_quiet_log_line(request_bytes, caplog):
    caplog.set_level(logging.DEBUG)
    async with running_server() as (url, _):
        raw = await raw_request(url, request_bytes)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as r:
            assert r.status == 200  # still serving
    status, body = status_and_json(raw)
    assert 400 <= status < 500 and "malformed HTTP request" in body["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "Traceback" not in caplog.text


async def open_socket(url: str):
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port)


async def closed_after(reader: asyncio.StreamReader, timeout: float) -> tuple[float, bytes]:
    """Seconds until the server closes the connection, and what it sent before."""
    start = time.monotonic()
    data = await asyncio.wait_for(reader.read(), timeout)
    return time.monotonic() - start, data


async def test_silent_sockets_and_slow_headers_are_closed():
    async with running_server(security=FAST) as (url, _):
        silent_r, silent_w = await open_socket(url)
        slow_r, slow_w = await open_socket(url)

        async def trickle() -> None:  # slow-loris: one header byte every 0.1 s, forever
            for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
                slow_w.write(bytes([byte]))
                await asyncio.sleep(0.1)

        sender = asyncio.create_task(trickle())
        try:
            silent_s, silent_data = await closed_after(silent_r, 5.0)
            slow_s, slow_data = await closed_after(slow_r, 5.0)
        finally:
            sender.cancel()
            silent_w.close()
            slow_w.close()
    assert silent_data == b"" and silent_s < 1.5
    assert slow_data == b"" and slow_s < 1.5


@pytest.mark.parametrize("body", [b"", b'{"sdp": "v=0'], ids=["nothing", "half"])
async def test_a_body_that_never_completes_gets_408_and_a_close(body):
    async with running_server(security=FAST) as (url, app):
        reader, writer = await open_socket(url)
        writer.write(
            b"POST /offer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n" + body
        )
        try:
            seconds, raw = await closed_after(reader, 5.0)
        finally:
            writer.close()
    status, reply = status_and_json(raw)
    assert status == 408 and "did not arrive within 0.5 s" in reply["error"]
    assert seconds < 1.5


async def test_an_unread_bogus_body_is_not_waited_for_forever():
    async with running_server(security=FAST) as (url, _):
        reader, writer = await open_socket(url)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9999\r\n\r\n")
        try:
            seconds, raw = await closed_after(reader, 5.0)
        finally:
            writer.close()
    assert raw.startswith(b"HTTP/1.1 200") and seconds < 1.5
