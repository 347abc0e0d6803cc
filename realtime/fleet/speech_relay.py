"""The speech WebSocket through a fleet front: `GET /sessions/{id}/speech` relayed to the
session's worker over Ray calls.

    agent ──WebSocket──▶ front (relay_speech) ──speech_send / speech_events──▶ worker
                                                     (SpeechChannels, `fleet.speech_channels`)

Workers take no HTTP, so the front holds the agent's socket and the worker holds a channel
in its place. The agent's messages (JSON control, binary PCM chunks) go to the worker in
order, in batches, one `speech_send` call at a time; the session's events come back by
long poll (`speech_events` waits up to `POLL_S` for the next one). Both directions are
bounded: the front reads the socket no faster than the worker takes its messages
(`INBOX`), and the worker ends a channel whose events are not collected. Every call has a
timeout: a worker that dies or stops answering ends the socket with an `error` event
saying so, and its channels end on their own when no front polls them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from realtime.errors import RealtimeError
from realtime.fleet.answers import answer_of
from realtime.fleet.pool import WorkerPool, WorkerView
from realtime.fleet.speech_channels import POLL_S
from realtime.speech_ws import MAX_MESSAGE
from realtime.utterance import message

log = logging.getLogger(__name__)
INBOX = 64  # agent messages read from the socket and not yet handed to the worker
BATCH_BYTES = 1 << 20  # at most this much of them in one speech_send call
SEND_TIMEOUT_S = 10.0  # an agent that reads none of its events this long is cut off


async def relay_speech(request: web.Request, pool: WorkerPool) -> web.WebSocketResponse:
    """The agent's socket for session `id`, wherever it runs: refused before the upgrade
    (JSON 404/503) when the session or its worker is not there."""
    session_id = request.match_info["id"]
    _, view = await pool.session_worker(session_id)
    channel_id = answer_of(await pool.on_worker(view, "speech_open", session_id))["channel"]
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, heartbeat=20.0)
    try:
        await ws.prepare(request)
        await _Relay(pool, view, channel_id, ws).run()
    finally:
        with contextlib.suppress(RealtimeError):  # a dead worker's channel is gone with it
            await pool.on_worker(view, "speech_close", channel_id)
    return ws


class _Relay:
    """One relayed socket: the agent's messages read into a bounded inbox and forwarded,
    the session's events delivered; the end of either direction ends the socket."""

    def __init__(
        self, pool: WorkerPool, view: WorkerView, channel_id: str, ws: web.WebSocketResponse
    ) -> None:
        self.pool, self.view, self.channel_id, self.ws = pool, view, channel_id, ws
        self.inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue(INBOX)
        self.close_code = WSCloseCode.OK

    async def run(self) -> None:
        reader = asyncio.ensure_future(self._read())
        loops = [asyncio.ensure_future(self._forward()), asyncio.ensure_future(self._deliver())]
        try:
            await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, *loops):
                task.cancel()
            await asyncio.gather(reader, *loops, return_exceptions=True)
            await self.ws.close(code=self.close_code)

    async def _read(self) -> None:
        """The agent's messages into the inbox, then None when its socket closes; waits
        (stops reading) while the inbox is full."""
        async for msg in self.ws:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await self.inbox.put(msg.data)
            elif msg.type == WSMsgType.ERROR:
                log.info("speech relay: socket error: %s", self.ws.exception())
                break
        await self.inbox.put(None)

    async def _forward(self) -> None:
        """The inbox to the worker, in order, a batch a call; returns once the messages
        the agent sent before closing its socket have all been handed over."""
        done = False
        while not done:
            batch: list[str | bytes] = []
            size = 0
            item = await self.inbox.get()
            while True:
                if item is None:
                    done = True
                    break
                batch.append(item)
                size += len(item)
                if self.inbox.empty() or size >= BATCH_BYTES:
                    break
                item = self.inbox.get_nowait()
            if not batch:
                continue
            try:
                answer = await self.pool.on_worker(self.view, "speech_send", self.channel_id, batch)
            except RealtimeError as exc:
                await self._fail(f"the session's worker is unavailable: {exc}")
                return
            if "error" in answer:  # the channel ended: _deliver says how
                log.debug("speech relay: %s", answer["error"])

    async def _deliver(self) -> None:
        timeout = POLL_S + self.pool.options.call_timeout_s
        while True:
            try:
                answer = await self.pool.on_worker(
                    self.view, "speech_events", self.channel_id, POLL_S, timeout=timeout
                )
            except RealtimeError as exc:
                await self._fail(f"the session's worker is unavailable: {exc}")
                return
            if "error" in answer:  # the worker ended the channel (no front polled it)
                await self._fail(answer["error"])
                return
            for text in answer["events"]:
                if not await self._send(text):
                    return
            if answer["closed"]:
                return

    async def _send(self, text: str) -> bool:
        try:
            await asyncio.wait_for(self.ws.send_str(text), SEND_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("speech relay: the agent reads none of its events; closing")
            return False
        except (ConnectionError, RuntimeError):  # closing already
            return False
        return True

    async def _fail(self, reason: str) -> None:
        """Say why on the socket (an `error` event), then it closes with 1011."""
        log.warning("speech relay for worker %s: %s", self.view.name, reason)
        self.close_code = WSCloseCode.INTERNAL_ERROR
        await self._send(message("error", message=reason))
