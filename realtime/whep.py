"""WHEP egress (draft-ietf-wish-whep): any number of viewers watch a live avatar session.

    POST    /whep/{session_id}        body: an SDP offer that receives (audio and/or video,
                                      `recvonly` or `sendrecv`), `Content-Type: application/sdp`
                                      → 201 Created, the answer (`sendonly`),
                                        `Location: /whep/{session_id}/{viewer_id}`, one
                                        `Link: <…>; rel="ice-server"` per configured server
    DELETE  /whep/{sid}/{viewer_id}   ends that viewer only → 200; the session goes on
    PATCH   /whep/{sid}/{viewer_id}   trickle ICE, as WHIP does it → 204; ICE restart → 422
    HEAD, GET /whep/{sid}[/{vid}]     200, `Content-Type: application/sdp`, no body (the
                                      draft's discoverability; GET has no representation)
    OPTIONS /whep/{sid}               200, `Accept-Post: application/sdp`

A viewer watches what the session's own peer gets: the same frames and audio, on the same
playout clock, from the moment it connects. Watching costs no engine time and no session
slot; a viewer leaving changes nothing for the session or the other viewers, and a
session that ends closes its viewers (their peer connections close: DTLS close_notify,
RTCP BYE).

**One generation, one encode, many viewers.** The viewers of a session hang on one
`WhepFanout`, a `MediaSink` of the session (`realtime.tracks`), so it receives every frame
and every 20 ms of audio exactly when the session sends them to its own peer; generation
runs once whatever the number of viewers. aiortc encodes per `RTCRtpSender`, and a relay of
decoded frames (aiortc's `MediaRelay`) would still run one VP8 encoder per viewer: 1.8 ms a
frame at 256x256 but 12 ms at 720p, a third of a core per viewer at 25 fps. So each
(session, codec) pair has one `SharedVideoEncoder` (libvpx or libx264 through PyAV, in its
own thread), and each 20 ms of audio is Opus-encoded once; every viewer's track hands the
same `av.Packet`s to its sender, which only packetizes, encrypts and sends them (aiortc's
`RTCRtpSender` takes pre-encoded packets). Every viewer of a codec therefore decodes the
very same pictures. The costs of sharing: one bitrate for all the viewers of a codec
(`video_bitrate`; no per-viewer REMB adaptation), and keyframes are shared: a viewer that
joins gets one at the next frame; one that reports loss (PLI/FIR, which the fan-out takes
from each sender) or fell behind gets one at most every `KEYFRAME_MIN_INTERVAL_S`; and there
is one every `GOP_FRAMES` whatever happens.

**Nobody waits for a slow viewer.** Everything on the media path only appends to bounded
queues: the encoder's input (`ENCODER_BACKLOG` frames; beyond that the oldest frame is
skipped for everyone of that codec, counted) and each viewer's packets (`VIEWER_BACKLOG`);
a viewer whose sender falls that far behind has its queue emptied and resumes at the next
keyframe (counted), and its audio drops the oldest 20 ms. The session's tracks never block.

Errors are JSON 4xx with a reason: 415 (not `application/sdp`), 400 (not SDP, no section
that receives, a `sendonly`/`inactive` section, two of a kind, no common codec, no ICE
credentials or fingerprint), 401 (token), 404 (no such live session or viewer), 503 (the
session has `max_viewers`).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import math
import secrets
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import av
import numpy as np
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.codecs.opus import OpusEncoder
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.sdp import SessionDescription
from av.video.frame import PictureType
from prometheus_client import CollectorRegistry, Counter, Gauge

from pipeline.clock import FPS, OUTPUT_RATE, VIDEO_CLOCK, VIDEO_TICKS_PER_FRAME
from realtime.errors import BadRequest, ServerFull, SessionNotFound
from realtime.offer import check_answer, check_codecs, check_offer_transport, reason_of
from realtime.security import read_body
from realtime.service import SERVICE
from realtime.session import PeerSession
from realtime.teardown import release_peer_connection
from realtime.whip import SDP_TYPE, check_sdp_type, created, parse_offer, trickle

log = logging.getLogger(__name__)
RECEIVING = ("recvonly", "sendrecv")
VIDEO_CODECS = {"video/vp8": "libvpx", "video/h264": "libx264"}  # all aiortc negotiates
GOP_FRAMES = 4 * FPS  # a keyframe at least every 4 s, for viewers whose PLI got lost
KEYFRAME_MIN_INTERVAL_S = 0.25  # losses (PLI) reported faster share one keyframe
ENCODER_BACKLOG = 5  # frames waiting for the shared encoder (a 200 ms stall, as the tracks)
VIEWER_BACKLOG = FPS  # 1 s of packets waiting for one viewer's sender
CONNECT_TIMEOUT_S = 30.0  # a viewer that has not connected by then is closed

# Each live session that has (or had) viewers → its fan-out.
WHEP_FANOUTS = web.AppKey("facecast-whep", dict[str, "WhepFanout"])


def add_whep_routes(app: web.Application) -> None:
    service = app[SERVICE]
    fanouts: dict[str, WhepFanout] = {}
    app[WHEP_FANOUTS] = fanouts
    app[WHEP_METRICS] = WhepMetrics(service.metrics.registry)
    service.describers.append(lambda s: {"viewers": _viewer_count(fanouts, s.id)})
    app.router.add_post("/whep/{id}", _post)
    app.router.add_get("/whep/{id}", _discover)  # and HEAD
    app.router.add_options("/whep/{id}", _options)
    app.router.add_get("/whep/{id}/{viewer}", _discover)
    app.router.add_delete("/whep/{id}/{viewer}", _delete)
    app.router.add_patch("/whep/{id}/{viewer}", _patch)


class WhepMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.viewers = Gauge(
            "facecast_whep_active_viewers", "WHEP viewers of a session", ["session"], registry=r
        )
        self.viewers_total = Counter(
            "facecast_whep_viewers_total", "WHEP viewers accepted", registry=r
        )
        self.viewers_rejected = Counter(
            "facecast_whep_viewers_rejected_total",
            "WHEP offers refused because the session had --max-viewers",
            registry=r,
        )
        self.frames_encoded = Counter(
            "facecast_whep_video_frames_encoded_total",
            "Video frames encoded for WHEP viewers: once per session and codec, whatever "
            "the number of viewers",
            ["codec"],
            registry=r,
        )
        self.frames_sent = Counter(
            "facecast_whep_video_frames_sent_total",
            "Encoded video frames taken by WHEP viewers' senders (one per viewer and frame)",
            registry=r,
        )
        self.frames_dropped = Counter(
            "facecast_whep_video_frames_dropped_total",
            "Video frames a WHEP viewer did not get: the shared encoder fell behind "
            "(encoder), or the viewer's sender did and resumed at a keyframe (viewer)",
            ["reason"],
            registry=r,
        )


WHEP_METRICS = web.AppKey("facecast-whep-metrics", WhepMetrics)


# ---- HTTP ----------------------------------------------------------------------------


async def _post(request: web.Request) -> web.Response:
    check_sdp_type(request, "a WHEP offer")
    service = request.app[SERVICE]
    sid = request.match_info["id"]
    live_session(request.app, sid)  # 404 before reading the body
    body = await read_body(request, service.config.security.body_timeout_s)
    viewer = await add_whep_viewer(request.app, sid, body)
    return created(viewer.pc.localDescription.sdp, viewer.location, service.config.ice_servers)


async def add_whep_viewer(app: web.Application, sid: str, body: bytes) -> Viewer:
    """A viewer of live session `sid` for a WHEP offer (POST /whep/{id} here, or a fleet
    worker's relay); 503 when the session has its `max_viewers`."""
    sdp, kinds = check_viewer_offer(body)
    session = live_session(app, sid)
    fanouts = app[WHEP_FANOUTS]
    fanout = fanouts.get(session.id)
    if fanout is None:
        fanout = fanouts[session.id] = WhepFanout(session, app[WHEP_METRICS], fanouts)
    limit = app[SERVICE].config.max_viewers
    if len(fanout.viewers) + fanout.reserved >= limit:
        fanout.metrics.viewers_rejected.inc()
        raise ServerFull(
            f"session {session.id} has its {limit} viewers (--max-viewers); try again later"
        )
    viewer = await fanout.add_viewer(sdp, kinds)
    log.info("session %s: WHEP viewer %s (%s)", session.id, viewer.id, viewer.describe())
    return viewer


async def _delete(request: web.Request) -> web.Response:
    sid, vid = request.match_info["id"], request.match_info["viewer"]
    return web.json_response(await close_whep_viewer(request.app, sid, vid))


async def close_whep_viewer(app: web.Application, sid: str, vid: str) -> dict:
    viewer = find_viewer(app, sid, vid)
    await viewer.close("ended by the WHEP player")
    return {"closed": viewer.id}


async def _patch(request: web.Request) -> web.Response:
    viewer = find_viewer(request.app, request.match_info["id"], request.match_info["viewer"])
    return await trickle(request, viewer.pc)


async def _discover(request: web.Request) -> web.Response:
    """HEAD tells a player this URL is a WHEP endpoint; GET has no representation."""
    check_whep_resource(request.app, request.match_info["id"], request.match_info.get("viewer"))
    return web.Response(status=200, headers={"Content-Type": SDP_TYPE})


async def _options(request: web.Request) -> web.Response:
    live_session(request.app, request.match_info["id"])
    return web.Response(status=200, headers=OPTIONS_HEADERS)


OPTIONS_HEADERS = {"Accept-Post": SDP_TYPE, "Allow": "OPTIONS, POST"}


def check_whep_resource(app: web.Application, sid: str, vid: str | None) -> None:
    """404 unless `sid` is a live session to watch (and `vid`, if given, its viewer)."""
    if vid is not None:
        find_viewer(app, sid, vid)
    else:
        live_session(app, sid)


def live_session(app: web.Application, sid: str) -> PeerSession:
    session = app[SERVICE].sessions.get(sid)
    fanout = app[WHEP_FANOUTS].get(sid)
    if session is None or session.state != "live" or (fanout is not None and fanout.closed):
        raise SessionNotFound(f"no live session {sid!r} to watch (GET /sessions lists them)")
    return session


def find_viewer(app: web.Application, sid: str, vid: str) -> Viewer:
    fanout = app[WHEP_FANOUTS].get(sid)
    viewer = fanout.viewers.get(vid) if fanout is not None else None
    if viewer is None:
        raise SessionNotFound(f"no WHEP viewer {vid!r} of session {sid!r}")
    return viewer


def _viewer_count(fanouts: dict[str, WhepFanout], sid: str) -> int:
    fanout = fanouts.get(sid)
    return 0 if fanout is None else len(fanout.viewers)


def check_viewer_offer(body: bytes) -> tuple[str, list[str]]:
    """The offer's SDP and the kinds it receives, if a WHEP viewer can be answered: each
    audio/video section receives (draft: `recvonly`, or `sendrecv`), one per kind, with a
    codec in common (Opus; VP8 or H.264) and ICE credentials and a fingerprint."""
    sdp, desc = parse_offer(body)
    kinds: list[str] = []
    for media in desc.media:
        if media.kind not in ("audio", "video"):
            continue
        direction = media.direction or "sendrecv"
        if direction not in RECEIVING:
            raise BadRequest(
                f"the offer's {media.kind} section is {direction}: a WHEP player receives, "
                "so offer recvonly (or sendrecv)"
            )
        if media.kind in kinds:
            raise BadRequest(f"the offer has two {media.kind} sections: WHEP sends one of each")
        kinds.append(media.kind)
        if media.kind == "audio" and not any(c.name.lower() == "opus" for c in media.rtp.codecs):
            theirs = sorted({c.name for c in media.rtp.codecs})
            raise BadRequest(f"no common audio codec: the offer has {theirs}, WHEP sends Opus")
    if not kinds:
        raise BadRequest("the offer receives nothing: add a recvonly video and/or audio section")
    check_codecs(sdp)
    check_offer_transport(sdp)
    return sdp, kinds


# ---- the fan-out ---------------------------------------------------------------------


class WhepFanout:
    """All the viewers of one session; a sink of the session (put_video/put_audio are
    called on the event loop by its tracks, exactly as they send)."""

    def __init__(
        self, session: PeerSession, metrics: WhepMetrics, registry: dict[str, WhepFanout]
    ) -> None:
        self.session_id = session.id
        self.video_size = session.video_size
        self.metrics = metrics
        self.viewers: dict[str, Viewer] = {}
        self.reserved = 0  # offers being negotiated
        self.encoders: dict[str, SharedVideoEncoder] = {}  # by codec mime type
        self.closed = False
        self._opus: OpusEncoder | None = None
        self._registry = registry
        self._closing: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        session.sinks.append(self)  # Session.close() closes its sinks: and so its viewers
        # Its video track ends first, before the engine thread has stopped: start then.
        session.video.on("ended", self.close)

    # ---- MediaSink -------------------------------------------------------------------

    def put_video(self, frame_rgb: np.ndarray, index: int) -> None:
        for encoder in self.encoders.values():
            encoder.put(frame_rgb, index)

    def put_audio(self, pcm_s16_48k: np.ndarray, sample_index: int) -> None:
        tracks = [v.audio for v in self.viewers.values() if v.audio is not None and v.audio.started]
        if not tracks:
            self._opus = None  # a new listener starts a fresh stream
            return
        if self._opus is None:
            self._opus = OpusEncoder()
        frame = av.AudioFrame.from_ndarray(pcm_s16_48k.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        frame.pts = sample_index
        frame.time_base = fractions.Fraction(1, OUTPUT_RATE)
        payloads, _ = self._opus.encode(frame)  # 20 ms in, one packet out: ~0.05 ms
        for payload in payloads:
            packet = av.Packet(payload)
            packet.pts = sample_index  # the session's own audio timeline, as its peer's
            packet.time_base = fractions.Fraction(1, OUTPUT_RATE)
            for track in tracks:
                track.push(packet)

    # ---- viewers ---------------------------------------------------------------------

    async def add_viewer(self, sdp: str, kinds: list[str]) -> Viewer:
        self.reserved += 1
        try:
            viewer = await self._negotiate(sdp, kinds)
        finally:
            self.reserved -= 1
        if self.closed:  # the session ended meanwhile
            await viewer.close("the session ended")
            raise SessionNotFound(f"session {self.session_id!r} ended")
        self.viewers[viewer.id] = viewer
        if viewer.codec is not None:
            encoder = self.encoders.get(viewer.codec)
            if encoder is None:
                encoder = self.encoders[viewer.codec] = SharedVideoEncoder(
                    viewer.codec, self.video_size, self.session_id, self.metrics
                )
            encoder.attach(viewer)
        viewer.watch()
        self.metrics.viewers_total.inc()
        self._count()
        return viewer

    async def _negotiate(self, sdp: str, kinds: list[str]) -> Viewer:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # as the session's: no STUN
        viewer = Viewer(self, secrets.token_urlsafe(18), pc)
        try:
            # Made before the offer is set, so that its sections take them.
            if "audio" in kinds:
                viewer.audio = ViewerAudioTrack()
                transceiver = pc.addTransceiver(viewer.audio, direction="sendonly")
                opus = [
                    c
                    for c in RTCRtpSender.getCapabilities("audio").codecs
                    if c.mimeType.lower() == "audio/opus"
                ]
                transceiver.setCodecPreferences(opus)  # the shared packets are Opus
            if "video" in kinds:
                viewer.video = ViewerVideoTrack(viewer)
                transceiver = pc.addTransceiver(viewer.video, direction="sendonly")
                # A PLI or FIR from this viewer asks the shared encoder for a keyframe
                # (aiortc's sender would only flag its own encoder, which packs here).
                transceiver.sender._send_keyframe = viewer.request_keyframe  # type: ignore[method-assign]
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            check_answer(pc.localDescription.sdp)
            viewer.codec = _answered_video_codec(pc.localDescription.sdp)
        except BadRequest:
            await viewer.close("offer refused")
            raise
        except Exception as exc:  # aiortc raises ValueError and friends on unusable offers
            await viewer.close("offer refused")
            raise BadRequest(f"cannot negotiate the offer: {reason_of(exc)}") from exc
        return viewer

    def forget(self, viewer: Viewer) -> None:
        if self.viewers.pop(viewer.id, None) is None:
            return
        if viewer.codec is not None:
            encoder = self.encoders.get(viewer.codec)
            if encoder is not None:
                encoder.detach(viewer)
                if not encoder.viewers:
                    del self.encoders[viewer.codec]
                    encoder.close()
        self._count()

    def _count(self) -> None:
        if not self.closed:
            self.metrics.viewers.labels(self.session_id).set(len(self.viewers))

    def close(self) -> asyncio.Task:
        """Close every viewer (the session ended); idempotent."""
        if self._closing is None:
            self.closed = True
            self._closing = self._loop.create_task(self._close())
        return self._closing

    async def _close(self) -> None:
        await asyncio.gather(
            *(v.close("the session ended") for v in list(self.viewers.values())),
            return_exceptions=True,
        )
        for encoder in self.encoders.values():
            encoder.close()
        self.encoders.clear()
        try:
            self.metrics.viewers.remove(self.session_id)
        except KeyError:
            pass
        if self._registry.get(self.session_id) is self:
            del self._registry[self.session_id]


def _answered_video_codec(answer: str) -> str | None:
    """The mime type the video sender sends (the answer's first video codec), if any."""
    for media in SessionDescription.parse(answer).media:
        if media.kind == "video" and media.port != 0:
            for codec in media.rtp.codecs:
                mime = f"video/{codec.name}".lower()
                if mime in VIDEO_CODECS:
                    return mime
    return None


class Viewer:
    """One WHEP player: a peer connection sending the session's shared packets."""

    def __init__(self, fanout: WhepFanout, viewer_id: str, pc: RTCPeerConnection) -> None:
        self.id = viewer_id
        self.fanout = fanout
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


# ---- tracks --------------------------------------------------------------------------


class _PacketTrack(MediaStreamTrack):
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


class ViewerAudioTrack(_PacketTrack):
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


class ViewerVideoTrack(_PacketTrack):
    kind = "video"

    def __init__(self, viewer: Viewer) -> None:
        super().__init__()
        self._viewer = viewer
        self._sent_total = viewer.fanout.metrics.frames_sent
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


# ---- the shared encoder --------------------------------------------------------------


def video_bitrate(width: int, height: int) -> int:
    """Bits per second for the shared stream: 0.06 bits a pixel at 25 fps, in
    [300 kbps, 2 Mbps] (aiortc's own VP8 starts at 500 kbps and adapts in [250k, 1.5M])."""
    return int(min(2_000_000, max(300_000, 0.06 * width * height * FPS)))


class SharedVideoEncoder:
    """One encoder for all the viewers of a session that receive `codec`."""

    def __init__(
        self, codec: str, size: tuple[int, int], session_id: str, metrics: WhepMetrics
    ) -> None:
        self.codec = codec
        self.size = size
        self.viewers: list[Viewer] = []
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

    def attach(self, viewer: Viewer) -> None:
        self.viewers.append(viewer)
        viewer.encoder = self

    def detach(self, viewer: Viewer) -> None:
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
