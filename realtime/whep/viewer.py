"""One WHEP player: a peer connection sending the session's shared packets."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from aiortc import RTCPeerConnection

from realtime.connection import release_peer_connection
from realtime.whep.encoder import SharedVideoEncoder
from realtime.whep.metrics import WhepMetrics
from realtime.whep.tracks import ViewerAudioTrack, ViewerVideoTrack

log = logging.getLogger(__name__)


CONNECT_TIMEOUT_S = 30.0  # a viewer that has not connected by then is closed


class ViewerHost(Protocol):
    """What a viewer asks of the fan-out it hangs on (`realtime.whep.fanout.WhepFanout`)."""

    session_id: str
    metrics: WhepMetrics

    def forget(self, viewer: Viewer) -> None: ...


class Viewer:
    """One WHEP player: a peer connection sending the session's shared packets."""

    def __init__(self, fanout: ViewerHost, viewer_id: str, pc: RTCPeerConnection) -> None:
        self.id = viewer_id
        self.fanout = fanout
        self.metrics = fanout.metrics  # its tracks count into the fan-out's
        self.pc = pc
        self.location = f"/whep/{fanout.session_id}/{viewer_id}"
        self.video: ViewerVideoTrack | None = None
        self.audio: ViewerAudioTrack | None = None
        self.codec: str | None = None
        self.encoder: SharedVideoEncoder | None = None
        self.close_reason = ""
        self._closing: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None

    def watch(self) -> None:
        self.pc.on("connectionstatechange", self._on_connection_state)
        self._watchdog = asyncio.get_running_loop().create_task(self._connect_deadline())

    def request_keyframe(self, now: bool = False) -> None:
        """A keyframe for this viewer: at the next frame (`now`: it joins), or within
        KEYFRAME_MIN_INTERVAL_S (its sender got a PLI or FIR, or it fell behind)."""
        if self.encoder is not None:
            self.encoder.request_keyframe(now)

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self._watchdog is not None:
            self._watchdog.cancel()  # it came; from now on ICE consent decides
        elif state in ("failed", "closed"):
            self.close(f"connection {state}")

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        self.close(f"not connected within {CONNECT_TIMEOUT_S:.0f} s")

    def close(self, reason: str) -> asyncio.Task:
        if self._closing is None:
            self.close_reason = reason
            self._closing = asyncio.get_running_loop().create_task(self._close())
        return self._closing

    async def _close(self) -> None:
        log.info(
            "session %s: WHEP viewer %s leaves (%s)",
            self.fanout.session_id,
            self.id,
            self.close_reason,
        )
        if self._watchdog is not None and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        self.fanout.forget(self)
        for track in (self.video, self.audio):
            if track is not None:
                track.stop()
        try:
            await self.pc.close()
        except Exception:
            log.exception("WHEP viewer %s: peer connection close failed", self.id)
        finally:
            for transceiver in self.pc.getTransceivers():  # the PLI hook: no cycle left
                transceiver.sender.__dict__.pop("_send_keyframe", None)
            if self.pc.connectionState == "closed":
                release_peer_connection(self.pc)
            self.pc.remove_all_listeners()

    def describe(self) -> dict[str, Any]:
        return {
            "kinds": [t.kind for t in (self.audio, self.video) if t is not None],
            "codec": self.codec,
        }
