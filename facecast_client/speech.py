"""The agent's side of the utterance channel (`realtime.utterance`): its messages, on the
data channel (`FacecastClient.speech`) or on the WebSocket `/sessions/{id}/speech`
(`SpeechSocket`).

    sender = UtteranceSender(send)             # send: a JSON text or a binary PCM message
    uid = await sender.say(pcm24k, 24_000)     # utterance_start, its PCM, utterance_end
    await sender.clear_buffer()                # barge-in: what is not yet played is dropped
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable

import aiohttp
import numpy as np


class UtteranceSender:
    """The agent's side of the utterance channel (`realtime.utterance`), on any transport:
    `send` takes a JSON text or a binary PCM message."""

    def __init__(self, send: Callable[[str | bytes], Awaitable[None] | None]) -> None:
        self._send = send
        self.sent_at: dict[str, float] = {}  # utterance id → monotonic time of its start

    async def _out(self, data: str | bytes) -> None:
        result = self._send(data)
        if result is not None:
            await result

    async def start(self, uid: str, sample_rate: int, num_channels: int = 1) -> None:
        self.sent_at[uid] = time.monotonic()
        await self._out(
            json.dumps(
                {
                    "type": "utterance_start",
                    "id": uid,
                    "sample_rate": sample_rate,
                    "num_channels": num_channels,
                }
            )
        )

    async def audio(self, pcm: bytes) -> None:
        """int16 PCM of the open utterance, at most 64 KiB a message."""
        await self._out(pcm)

    async def end(self, uid: str) -> None:
        await self._out(json.dumps({"type": "utterance_end", "id": uid}))

    async def clear_buffer(self, uid: str | None = None) -> None:
        msg = {"type": "clear_buffer"} if uid is None else {"type": "clear_buffer", "id": uid}
        await self._out(json.dumps(msg))

    async def say(
        self,
        pcm: np.ndarray,
        sample_rate: int,
        uid: str | None = None,
        speed: float | None = None,
        chunk_ms: int = 40,
    ) -> str:
        """One whole utterance: int16 PCM (n,) or (n, channels), sent in `chunk_ms` pieces
        at `speed` times real time (None: as fast as the transport takes it). Returns its id."""
        uid = uid or uuid.uuid4().hex[:12]
        pcm = np.asarray(pcm, np.int16)
        frames = pcm.reshape(pcm.shape[0], -1)
        step = max(1, sample_rate * chunk_ms // 1000)
        await self.start(uid, sample_rate, frames.shape[1])
        t0 = time.monotonic()
        for i in range(0, frames.shape[0], step):
            await self.audio(frames[i : i + step].tobytes())
            if speed:
                due = t0 + (i + step) / sample_rate / speed
                await asyncio.sleep(max(0.0, due - time.monotonic()))
        await self.end(uid)
        return uid


class SpeechSocket:
    """The utterance channel over the WebSocket `/sessions/{id}/speech`; `events` collects
    what the server sends on it (each with "_t", monotonic)."""

    def __init__(self, url: str, session_id: str, token: str | None = None) -> None:
        base = url.rstrip("/")
        self.url = f"{base}/sessions/{session_id}/speech"
        self.token = token
        self.events: list[dict] = []
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse[bool] | None = None
        self._reader: asyncio.Task | None = None
        self._new_event = asyncio.Condition()
        self.speech = UtteranceSender(self._send)

    async def connect(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = aiohttp.ClientSession()
        try:
            self._ws = await self._http.ws_connect(self.url, headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            await self._http.close()
            raise ConnectionError(f"speech socket refused ({exc.status}): {exc.message}") from exc
        self._reader = asyncio.ensure_future(self._read())

    async def _send(self, data: str | bytes) -> None:
        assert self._ws is not None, "connect() first"
        if isinstance(data, str):
            await self._ws.send_str(data)
        else:
            await self._ws.send_bytes(data)

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                event["_t"] = time.monotonic()
                self.events.append(event)
                async with self._new_event:
                    self._new_event.notify_all()

    async def wait_event(self, kind: str, timeout: float = 30.0, after: float = 0.0) -> dict:
        return await wait_for_event(self.events, self._new_event, kind, timeout, after)

    @property
    def closed(self) -> bool:
        return self._ws is None or self._ws.closed

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._http is not None:
            await self._http.close()


async def wait_for_event(
    events: list[dict], condition: asyncio.Condition, kind: str, timeout: float, after: float
) -> dict:
    """The first of `events` of `kind` received after monotonic time `after` (each event
    has "_t"), waiting on `condition`, which is notified as events come."""

    def found() -> dict | None:
        return next((e for e in events if e["type"] == kind and e["_t"] > after), None)

    async def wait() -> None:
        async with condition:
            await condition.wait_for(lambda: found() is not None)

    await asyncio.wait_for(wait(), timeout)
    return found()  # type: ignore[return-value]
