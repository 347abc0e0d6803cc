"""A viewer's outgoing tracks: pre-encoded packets handed to its senders."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.clock import FPS, VIDEO_TICKS_PER_FRAME
from realtime.whep.metrics import WhepMetrics

VIEWER_BACKLOG = FPS  # 1 s of packets waiting for one viewer's sender


class TrackOwner(Protocol):
    """What a video track asks of its viewer (`realtime.whep.viewer.Viewer`): a keyframe
    (it joins, or fell behind), and the metrics it counts its frames in."""

    @property
    def metrics(self) -> WhepMetrics: ...

    def request_keyframe(self, now: bool = False) -> None: ...


class PacketTrack(MediaStreamTrack):
    """Hands queued pre-encoded packets to its sender, which packs them as they come
    (the session paced them). Starts taking packets at the sender's first `recv()`."""

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[av.Packet] = deque()
        self._ready = asyncio.Event()
        self.started = False
        self.sent = 0
        self.dropped = 0

    def stop(self) -> None:
        super().stop()
        self._ready.set()

    def _start(self) -> None:
        self.started = True

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if not self.started:
            self._start()
        while not self._queue and self.readyState == "live":
            self._ready.clear()
            await self._ready.wait()
        if self.readyState != "live":
            raise MediaStreamError
        self.sent += 1
        self._on_sent()
        return self._queue.popleft()

    def _on_sent(self) -> None:
        pass


class ViewerAudioTrack(PacketTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.first_sample: int | None = None  # the session audio this viewer started at

    def push(self, packet: av.Packet) -> None:
        if self.readyState != "live":
            return
        if self.first_sample is None:
            self.first_sample = int(packet.pts or 0)
        if len(self._queue) >= 2 * VIEWER_BACKLOG:  # 1 s of 20 ms packets
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(packet)
        self._ready.set()


class ViewerVideoTrack(PacketTrack):
    kind = "video"

    def __init__(self, viewer: TrackOwner) -> None:
        super().__init__()
        self._viewer = viewer
        self._sent_total = viewer.metrics.frames_sent
        self._need_keyframe = True  # a decoder starts at a keyframe
        self.first_index: int | None = None  # the session frame this viewer started at

    def _start(self) -> None:
        super()._start()
        self._viewer.request_keyframe(now=True)

    def _on_sent(self) -> None:
        self._sent_total.inc()

    def stop(self) -> None:
        super().stop()
        self._viewer = None  # type: ignore[assignment]  # no cycle through a stopped track

    def push(self, packet: av.Packet) -> int:
        """Queue `packet`; returns how many frames this viewer lost to its backlog."""
        if not self.started or self.readyState != "live":
            return 0
        lost = 0
        if len(self._queue) >= VIEWER_BACKLOG:  # its sender fell 1 s behind: start over
            lost = len(self._queue)
            self.dropped += lost
            self._queue.clear()
            self._need_keyframe = True
            self._viewer.request_keyframe()
        if self._need_keyframe:
            if not packet.is_keyframe:
                return lost
            self._need_keyframe = False
        if self.first_index is None:
            self.first_index = int(packet.pts or 0) // VIDEO_TICKS_PER_FRAME
        self._queue.append(packet)
        self._ready.set()
        return lost
