"""The worker's end of a relayed speech WebSocket (`realtime.fleet.speech_relay` is the
front's): a channel in the socket's place, the session's listener, as `realtime.speech_ws`
makes the socket one.

    front ──speech_open / speech_send / speech_events / speech_close──▶ SpeechChannels
                                                                        (this worker)

The agent's messages reach the session in order (`send`); its events are queued and taken
by long poll (`events` waits up to `POLL_S` for the next one). A channel whose events are
not collected is ended, as a socket that stops reading is, and one that no front has
polled for `IDLE_S` is ended too: its front went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque

from realtime.errors import SessionNotFound
from realtime.session import PeerSession
from realtime.speech_ws import OUTBOX

log = logging.getLogger(__name__)
POLL_S = 5.0  # how long one speech_events call waits for an event
IDLE_S = 30.0  # a channel no front has polled for this long is ended (its front is gone)


class Channel:
    """One relayed socket on the worker: the session's events, queued for the front."""

    def __init__(self, session: PeerSession) -> None:
        self.session = session
        self.events: deque[str] = deque()
        self.closed = False  # the session ended, or the events were not collected
        self.last_seen = time.monotonic()  # the front's last call for this channel
        self._ready = asyncio.Event()
        session.listeners.append(self.push)
        session.video.on("ended", self.end)  # PeerSession.close() stops its tracks

    def push(self, text: str) -> None:
        if self.closed:
            return
        if len(self.events) >= OUTBOX:  # never collected: end this channel, not the session
            log.warning("session %s: relayed speech events not read; closing", self.session.id)
            self.end()
            return
        self.events.append(text)
        self._ready.set()

    def end(self) -> None:
        """No more events (after the session's `session_closed`, which is queued)."""
        self.closed = True
        self._ready.set()

    async def take(self, wait_s: float) -> dict:
        self.last_seen = time.monotonic()
        if not self.events and not self.closed:
            self._ready.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready.wait(), wait_s)
        out = list(self.events)
        self.events.clear()
        self.last_seen = time.monotonic()
        return {"events": out, "closed": self.closed}

    def detach(self) -> None:
        """Stop listening; an utterance left open by the socket ends where it got to."""
        self.end()
        if self.push in self.session.listeners:
            self.session.listeners.remove(self.push)
        self.session.video.remove_listener("ended", self.end)
        self.session.speech.transport_closed()


class SpeechChannels:
    """A worker's relayed speech sockets, by channel id."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self._channels: dict[str, Channel] = {}
        self._reaper: asyncio.Task | None = None

    def open(self, session: PeerSession) -> str:
        channel_id = secrets.token_urlsafe(12)
        self._channels[channel_id] = Channel(session)
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        return channel_id

    def send(self, channel_id: str, messages: list[str | bytes]) -> None:
        """The agent's messages, in order, to the session (errors come back as events)."""
        channel = self._get(channel_id)
        channel.last_seen = time.monotonic()
        for raw in messages:
            channel.session.handle_message(raw, channel.push)

    async def events(self, channel_id: str, wait_s: float) -> dict:
        """The events queued (waiting up to `wait_s` for one), and whether that was all."""
        channel = self._get(channel_id)
        answer = await channel.take(min(max(wait_s, 0.0), POLL_S))
        if answer["closed"]:
            self.close(channel_id)
        return answer

    def close(self, channel_id: str) -> None:
        channel = self._channels.pop(channel_id, None)
        if channel is not None:
            channel.detach()

    def _get(self, channel_id: str) -> Channel:
        channel = self._channels.get(channel_id)
        if channel is None:
            raise SessionNotFound(f"no open speech channel {channel_id!r} (its session ended)")
        return channel

    async def _reap(self) -> None:
        """End the channels of fronts that went away without closing them."""
        while True:
            await asyncio.sleep(self.idle_s / 3)
            now = time.monotonic()
            for channel_id, channel in list(self._channels.items()):
                if now - channel.last_seen > self.idle_s:
                    log.info("session %s: relayed speech channel idle; closed", channel.session.id)
                    self.close(channel_id)
