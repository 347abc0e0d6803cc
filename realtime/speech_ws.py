"""The utterance channel over a WebSocket: `GET /sessions/{id}/speech` (upgrade).

For an agent that keeps its audio off WebRTC (its TTS runs beside the server, or the
viewer is someone else's browser): the messages are exactly the data channel's
(`realtime.utterance`): JSON text for control, binary for PCM; every session event
(`playback_started`, `playback_finished`, `stats`, …) comes back on it too. Auth and the
same-origin rules are the server's middlewares, as for any route (a token travels in the
`Authorization: Bearer` header of the upgrade request).

The events wait in a bounded queue for the socket; a client that stops reading them is
disconnected rather than let the queue grow. The socket closes when the session does,
after its `session_closed` event; a socket that closes mid-utterance ends that utterance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSMsgType, web

from realtime.service import session_from_request
from realtime.session import PeerSession
from realtime.utterance import MAX_CHUNK_BYTES

OUTBOX = 1024  # events waiting for a slow socket before it is cut off
# Larger messages are answered with an `error` (MAX_CHUNK_BYTES is the limit); beyond this
# aiohttp closes the socket (1009, message too big) rather than read them.
MAX_MESSAGE = 16 * MAX_CHUNK_BYTES
log = logging.getLogger(__name__)


def add_speech_routes(app: web.Application) -> None:
    app.router.add_get("/sessions/{id}/speech", _speech)


async def _speech(request: web.Request) -> web.WebSocketResponse:
    session = session_from_request(request)
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, heartbeat=20.0)
    await ws.prepare(request)
    outbox: asyncio.Queue[str | None] = asyncio.Queue(OUTBOX)

    def send(text: str) -> None:
        try:
            outbox.put_nowait(text)
        except asyncio.QueueFull:  # never read: end this socket, not the session
            log.warning("session %s: speech socket not reading its events; closing", session.id)
            with contextlib.suppress(asyncio.QueueEmpty):
                outbox.get_nowait()
            outbox.put_nowait(None)

    def session_ended() -> None:  # after its `session_closed` event, which is queued
        with contextlib.suppress(asyncio.QueueFull):
            outbox.put_nowait(None)

    session.listeners.append(send)
    session.video.on("ended", session_ended)  # PeerSession.close() stops its tracks
    writer = asyncio.create_task(_write(ws, outbox), name=f"speech-out-{session.id[:8]}")
    try:
        await _read(session, ws, send)
    finally:
        if send in session.listeners:
            session.listeners.remove(send)
        session.video.remove_listener("ended", session_ended)
        session.speech.transport_closed()
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        await ws.close()
    return ws


async def _read(session: PeerSession, ws: web.WebSocketResponse, reply) -> None:
    async for msg in ws:
        if session.state == "closed":
            break
        if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            session.handle_message(msg.data, reply)
        elif msg.type == WSMsgType.ERROR:
            log.info("session %s: speech socket error: %s", session.id, ws.exception())
            break


async def _write(ws: web.WebSocketResponse, outbox: asyncio.Queue[str | None]) -> None:
    while True:
        text = await outbox.get()
        if text is None:
            await ws.close()
            return
        try:
            await ws.send_str(text)
        except (ConnectionError, RuntimeError):  # closing already
            return
