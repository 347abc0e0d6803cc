"""The shared encoder: one per (session, codec), in its own thread, for every viewer."""

from __future__ import annotations

import asyncio
import fractions
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol, cast

import av
import numpy as np
from av.video.frame import PictureType

from pipeline.clock import FPS, VIDEO_CLOCK, VIDEO_TICKS_PER_FRAME

if TYPE_CHECKING:
    from realtime.whep.metrics import WhepMetrics
    from realtime.whep.tracks import ViewerVideoTrack

log = logging.getLogger(__name__)


VIDEO_CODECS = {"video/vp8": "libvpx", "video/h264": "libx264"}  # all aiortc negotiates
GOP_FRAMES = 4 * FPS  # a keyframe at least every 4 s, for viewers whose PLI got lost
KEYFRAME_MIN_INTERVAL_S = 0.25  # losses (PLI) reported faster share one keyframe
ENCODER_BACKLOG = 5  # frames waiting for the shared encoder (a 200 ms stall, as the tracks)


def video_bitrate(width: int, height: int) -> int:
    """Bits per second for the shared stream: 0.06 bits a pixel at 25 fps, in
    [300 kbps, 2 Mbps] (aiortc's own VP8 starts at 500 kbps and adapts in [250k, 1.5M])."""
    return int(min(2_000_000, max(300_000, 0.06 * width * height * FPS)))


class Subscriber(Protocol):
    """What the encoder asks of a viewer (`realtime.whep.viewer.Viewer`): the video track
    its packets go to, and a place for the encoder it is attached to."""

    video: ViewerVideoTrack | None
    encoder: SharedVideoEncoder | None


class SharedVideoEncoder:
    """One encoder for all the viewers of a session that receive `codec`."""

    def __init__(
        self, codec: str, size: tuple[int, int], session_id: str, metrics: WhepMetrics
    ) -> None:
        self.codec = codec
        self.size = size
        self.viewers: list[Subscriber] = []
        self.encoded = 0
        self.skipped = 0
        self._metrics = metrics
        self._label = codec.split("/")[1]
        self._sid = session_id
        self._pending: deque[tuple[np.ndarray, int]] = deque()
        self._wake = asyncio.Event()
        self._keyframe_wanted = True
        self._keyframe_now = True  # the first frame is one
        self._last_keyframe = -math.inf
        self._ctx: av.VideoCodecContext | None = None
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix=f"whep-{self._label}-{session_id[:8]}"
        )
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"whep-{self._label}-{session_id[:8]}"
        )

    def attach(self, viewer: Subscriber) -> None:
        self.viewers.append(viewer)
        viewer.encoder = self

    def detach(self, viewer: Subscriber) -> None:
        if viewer in self.viewers:
            self.viewers.remove(viewer)
        viewer.encoder = None

    def request_keyframe(self, now: bool = False) -> None:
        self._keyframe_wanted = True
        self._keyframe_now = self._keyframe_now or now

    def put(self, rgb: np.ndarray, index: int) -> None:
        """A frame the session sends (event loop; never blocks)."""
        if not any(v.video is not None and v.video.started for v in self.viewers):
            return  # nobody connected yet: nothing to encode
        if len(self._pending) >= ENCODER_BACKLOG:
            self._pending.popleft()
            self.skipped += 1
            self._metrics.frames_dropped.labels("encoder").inc(len(self.viewers))
        self._pending.append((rgb, index))
        self._wake.set()

    def close(self) -> None:
        self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                rgb, index = self._pending.popleft()
                now = time.monotonic()
                force = self._keyframe_now or (
                    self._keyframe_wanted and now - self._last_keyframe >= KEYFRAME_MIN_INTERVAL_S
                )
                try:
                    packets = await loop.run_in_executor(
                        self._executor, self._encode, rgb, index, force
                    )
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception(
                        "session %s: WHEP %s encoder failed; restarting it", self._sid, self._label
                    )
                    self._ctx = None  # a new one starts with a keyframe
                    continue
                self._deliver(packets, now)

    def _deliver(self, packets: list[av.Packet], now: float) -> None:
        for packet in packets:
            self.encoded += 1
            self._metrics.frames_encoded.labels(self._label).inc()
            if packet.is_keyframe:
                self._keyframe_wanted = self._keyframe_now = False
                self._last_keyframe = now
            for viewer in list(self.viewers):
                track = viewer.video
                if track is None:
                    continue
                lost = track.push(packet)
                if lost:
                    self._metrics.frames_dropped.labels("viewer").inc(lost)

    def _encode(self, rgb: np.ndarray, index: int, keyframe: bool) -> list[av.Packet]:
        """Encoder thread: one frame in, its packet out (no lag, no B-frames)."""
        if self._ctx is None:
            self._ctx = open_video_encoder(self.codec, *self.size)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
        frame.pts = index * VIDEO_TICKS_PER_FRAME
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        frame.pict_type = PictureType.I if keyframe else PictureType.NONE
        packets = list(self._ctx.encode(frame))
        for packet in packets:
            packet.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        return packets


def open_video_encoder(codec: str, width: int, height: int) -> av.VideoCodecContext:
    """A real-time encoder of `codec` ("video/vp8" or "video/h264") as aiortc sets its
    own up: no lookahead, no B-frames, error resilient; constant bitrate."""
    ctx = cast(av.VideoCodecContext, av.CodecContext.create(VIDEO_CODECS[codec], "w"))
    ctx.width, ctx.height = width, height
    ctx.pix_fmt = "yuv420p"
    ctx.time_base = fractions.Fraction(1, VIDEO_CLOCK)
    ctx.framerate = fractions.Fraction(FPS, 1)
    ctx.bit_rate = bitrate = video_bitrate(width, height)
    ctx.gop_size = GOP_FRAMES
    threads = "1" if width * height <= 307_200 else "2"  # up to 640x480: one thread
    if codec == "video/vp8":
        ctx.options = {
            "deadline": "realtime",
            "cpu-used": "8",
            "lag-in-frames": "0",
            "auto-alt-ref": "0",
            "error-resilient": "1",
            "threads": threads,
            "minrate": str(bitrate),
            "maxrate": str(bitrate),
            "bufsize": str(bitrate),
        }
    else:
        ctx.profile = "Baseline"  # what aiortc answers: constrained baseline, level 3.1
        ctx.options = {
            "preset": "veryfast",
            "tune": "zerolatency",
            "level": "31",
            "forced-idr": "1",
            "threads": threads,
        }
    return ctx
