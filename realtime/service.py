"""One server's engine and sessions, and opening a session from a WebRTC offer.

`Service` (stored on the app under `SERVICE`) owns the engine, the live sessions and the
metrics; `open_session` turns a checked offer into a running `PeerSession` (POST /offer,
POST /whip, a fleet worker). The routes that use them live in `realtime.server`,
`realtime.whip`, `realtime.whep` and `realtime.speech_ws`; this module imports none of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import av
import numpy as np
import torch
from aiohttp import web
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.codecs import CODECS
from aiortc.sdp import SessionDescription

from pipeline.clock import FPS
from pipeline.config import FacecastConfig
from pipeline.startup import EngineOptions, start_engine
from pipeline.stream import AvatarStream, Reference, StreamingEngine
from realtime.engine_process import EngineProcess
from realtime.errors import (
    BadRequest,
    EngineStarting,
    ServerFull,
    SessionNotFound,
)
from realtime.kvs import (
    KvsConfigError,
    KvsMirror,
    KvsOptions,
    StreamNamer,
)
from realtime.kvs.options import check_stream_name
from realtime.metrics import RealtimeMetrics
from realtime.photos import PhotoStore
from realtime.playout import EngineTiming
from realtime.security import (
    SecurityConfig,
    read_body,
)
from realtime.session import PeerSession, SessionConfig
from realtime.tracks import MediaSink
from realtime.vad import VoiceActivityDetector

log = logging.getLogger(__name__)


OFFER_OPTIONS = {"sdp", "type", "seed", "kvs_stream", "photo_id", "photo", "face_box"}


def engine_in_own_process(options: EngineOptions) -> bool:
    """Where the engine runs unless told: in a process of its own on a CPU (one core left
    to the media loop), in the server's process on a GPU (bench/RESULTS.md has both)."""
    return options.device == "cpu"


def torch_threads_in_process(options: EngineOptions, stack: str) -> int | None:
    """torch's CPU thread count for a server whose engine runs in the server's process (None:
    leave it). On a GPU the photo stack computes nothing on the CPU with torch, and torch's
    threads serve the VAD's 512-sample windows: 16 of them beside the media loop kept the
    VAD thread 79 % busy, and `photo720` reached the viewer at 15-17 fps of 25; with one,
    100 % fresh at 25 fps (bench/RESULTS.md, "The photo stack at 720p"). The diffusion
    engine keeps its threads: with one, rt720-low-latency's served steps took 0.55-0.78 s
    against 0.44 s, and its first live call waited 33 s for a frame."""
    if options.threads is not None or options.device == "cpu" or stack != "photo":
        return None
    return 1


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_sessions: int = 4
    token: str | None = None
    reference: str | None = None  # image file; default: the engine's packaged reference
    # the reference's face framed by hand (photo stack): x, y, w, h in its own pixels
    face_box: tuple[float, float, float, float] | None = None
    # `serve`: the engine in its own process (None: on a CPU, where it measured 35-50%
    # faster steps beside the media loop; not on a GPU, where the frames' trip through
    # shared memory cost 0.07-0.14 s a 720p step and in-process steps matched bench)
    engine_process: bool | None = None
    max_body_bytes: int = 64 * 1024  # an SDP offer is a few KiB
    session: SessionConfig = field(default_factory=SessionConfig)
    kvs: KvsOptions | None = None  # mirror every session to Kinesis Video Streams
    ice_servers: list[RTCIceServer] = field(default_factory=list)  # advertised to WHIP/WHEP
    # STUN/TURN the server's own peers gather candidates with (a fleet worker behind NAT);
    # none by default: on loopback and a LAN, host candidates are all there is to find
    peer_ice_servers: list[RTCIceServer] = field(default_factory=list)
    max_viewers: int = 16  # WHEP viewers per session (realtime/whep.py)
    security: SecurityConfig = field(default_factory=SecurityConfig)  # same-origin, timeouts


# Called for each new session; returns a started sink (or None) that receives the output
# frames and audio, e.g. `realtime.kvs.KvsMirror`. The session closes it when it ends.
SinkFactory = Callable[[PeerSession], Awaitable[MediaSink | None]]


class Service:
    """Everything one app instance owns: engine, sessions, metrics. Stored on the app."""

    def __init__(
        self,
        config: ServerConfig,
        engine: StreamingEngine | None,
        sink_factories: Sequence[SinkFactory] = (),
    ) -> None:
        self.config = config
        self.engine = engine  # None until `start_engine` has it warm
        self.startup_error: str | None = None
        self.startup_began = time.monotonic()
        self.sink_factories = list(sink_factories)
        self.metrics = RealtimeMetrics()
        if engine is not None:
            self._mark_ready(engine)
        self.sessions: dict[str, PeerSession] = {}
        # awaited after a session has closed (a fleet worker reports it to the cluster)
        self.close_listeners: list[Callable[[PeerSession], Awaitable[None]]] = []
        self.reserved = 0  # offers being negotiated count against capacity
        self.engine_lock = threading.Lock()  # one generate_ready() at a time per engine
        self.reference: Reference | None = None  # the server's identity (load_reference below)
        self.photos = PhotoStore()  # the page's uploads (realtime/photos.py)
        # more of each session in GET /sessions, e.g. its WHEP viewers (realtime/whep.py)
        self.describers: list[Callable[[PeerSession], dict]] = []

    @property
    def state(self) -> str:
        if self.engine is not None:
            return "ok"
        return "failed" if self.startup_error else "starting"

    async def start_engine(self, options: EngineOptions, own_process: bool | None = None) -> None:
        """Start the engine off the event loop, in a process of its own unless told not to
        (`realtime.engine_process`); sessions are refused until it is warm."""
        if own_process is None:
            own_process = engine_in_own_process(options)
        if own_process and options.device == "cpu" and options.threads is None:
            # leave a core to the media loop: an engine whose threads outnumber the free
            # cores stalls at every barrier (the demo on 2 cores beside a busy loop: 0.25 s
            # a step alone, 0.76 s with 2 threads, 0.41 s either way with 1)
            options = dataclasses.replace(options, threads=max(1, (os.cpu_count() or 2) - 1))
        try:
            if own_process:
                engine = await asyncio.to_thread(EngineProcess, options)
                torch.set_num_threads(1)  # this process only runs the VAD now
            else:
                engine, _ = await asyncio.to_thread(start_engine, options)
                threads = torch_threads_in_process(options, engine.cfg.runtime.stack)
                if threads is not None:
                    torch.set_num_threads(threads)
        except Exception as exc:  # reported by /healthz and by `serve`, which then exits
            self.startup_error = f"{type(exc).__name__}: {exc}"
            log.error("engine start-up failed: %s", self.startup_error)
            return
        self._mark_ready(engine)

    def _mark_ready(self, engine: StreamingEngine) -> None:
        report = getattr(engine, "startup", None)
        seconds = report.seconds if report is not None else 0.0
        self.startup_seconds = seconds
        self.metrics.startup_seconds.set(seconds)
        self.metrics.ready.set(1)
        self.engine = engine

    def warm_engine(self) -> StreamingEngine:
        if self.engine is None:
            raise EngineStarting("the engine is starting; try again shortly")
        return self.engine

    def describe(self, session: PeerSession) -> dict:
        out = session.describe()
        for describe in self.describers:
            out.update(describe(session))
        return out

    def video_size(self) -> tuple[int, int]:
        video = self.warm_engine().cfg.video
        return int(video.width), int(video.height)

    def open_engine_stream(self, seed: int, photo: Reference | None = None) -> AvatarStream:
        """An engine stream of the server's reference, or of the offer's own photo."""
        engine = self.warm_engine()
        if photo is not None:
            return engine.new_stream(photo, seed=seed)
        if self.reference is None:
            self.reference = load_reference(self.config.reference, engine.cfg, self.config.face_box)
        return engine.new_stream(self.reference, seed=seed)

    async def on_session_closed(self, session: PeerSession) -> None:
        if self.sessions.pop(session.id, None) is not None:
            self.metrics.active_sessions.set(len(self.sessions))
        for listener in self.close_listeners:
            try:
                await listener(session)
            except Exception:
                log.exception("session %s: close listener %r failed", session.id, listener)


SERVICE = web.AppKey("facecast", Service)


CONFIG = web.AppKey("facecast-config", ServerConfig)


def require_engine(service: Service) -> None:
    """Offers wait for a warm engine: 503 while it starts (POST /offer and POST /whip)."""
    if service.engine is None:
        if service.startup_error:
            raise EngineStarting(f"the engine failed to start: {service.startup_error}")
        waited = time.monotonic() - service.startup_began
        raise EngineStarting(
            f"the engine is still starting ({waited:.0f} s so far); retry when /healthz is ok"
        )


async def open_session(
    service: Service, request: OfferRequest, require_video: bool = True
) -> PeerSession:
    """A new live session for `request`, if a slot is free (POST /offer and POST /whip).

    `require_video=False` accepts an offer with no video section (a WHIP client that only
    sends its microphone): the avatar is generated all the same, just not sent to it."""
    if len(service.sessions) + service.reserved >= service.config.max_sessions:
        service.metrics.sessions_rejected.inc()
        raise ServerFull(
            f"server full: {service.config.max_sessions} sessions are live; try again later"
        )
    service.reserved += 1
    try:
        return await _negotiate(service, request, require_video)
    finally:
        service.reserved -= 1


async def _negotiate(service: Service, request: OfferRequest, require_video: bool) -> PeerSession:
    offer = request.description
    pc = RTCPeerConnection(RTCConfiguration(iceServers=list(service.config.peer_ice_servers)))
    session_config = SessionConfig(**{**service.config.session.__dict__, "seed": request.seed})
    vad = await asyncio.to_thread(VoiceActivityDetector)  # loads its model: off the loop
    session = PeerSession(
        secrets.token_urlsafe(18),
        pc,
        lambda seed: service.open_engine_stream(seed, request.photo),
        service.video_size(),
        session_config,
        service.metrics,
        service.on_session_closed,
        vad,
        EngineTiming.of(service.engine, isinstance(service.engine, EngineProcess)),
        service.engine_lock,
    )
    try:
        check_codecs(offer.sdp)
        await pc.setRemoteDescription(offer)
        _check_transceivers(pc, require_video)
        offered = {t.kind for t in pc.getTransceivers()}
        for track in (session.audio, session.video):
            if track.kind in offered:  # an answer cannot add a media section
                pc.addTrack(track)
        for transceiver in pc.getTransceivers():
            if transceiver.kind == "video":
                # Video only goes out. A peer's camera (OBS over WHIP sends one) would be
                # decoded into aiortc's unbounded queue that nothing reads.
                transceiver.direction = "sendonly"
        answer = await pc.createAnswer()
        await pc.setLocalDescription(answer)
        check_answer(pc.localDescription.sdp)
    except BadRequest:
        await session.close("offer refused")
        raise
    except Exception as exc:  # aiortc raises ValueError and friends on unusable offers
        await session.close("offer refused")
        raise BadRequest(f"cannot negotiate the offer: {reason_of(exc)}") from exc
    session.offer_options = {"kvs_stream": request.kvs_stream}
    service.sessions[session.id] = session
    service.metrics.sessions_total.inc()
    service.metrics.active_sessions.set(len(service.sessions))
    for factory in service.sink_factories:
        try:
            sink = await factory(session)
        except Exception:  # a mirror that cannot start never costs the peer its call
            log.exception("session %s: sink factory %r failed", session.id, factory)
            continue
        if sink is not None:
            session.sinks.append(sink)
    session.start()
    return session


def _check_transceivers(pc: RTCPeerConnection, require_video: bool = True) -> None:
    kinds = {t.kind for t in pc.getTransceivers()}
    if "audio" not in kinds:
        raise BadRequest(
            "the offer has no audio track: add the microphone (or an audio "
            "transceiver) before creating the offer"
        )
    if require_video and "video" not in kinds:
        raise BadRequest(
            "the offer has no video transceiver: add one (recvonly) to receive the avatar"
        )


def check_codecs(sdp: str) -> None:
    """Refuse early, with a reason, when the offer shares no codec with aiortc."""
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadRequest(f"the offer's SDP does not parse: {reason_of(exc)}") from exc
    for media in desc.media:
        if media.kind not in ("audio", "video"):
            continue
        ours = {c.mimeType.lower() for c in CODECS[media.kind]} - {"video/rtx"}
        theirs = {f"{media.kind}/{c.name}".lower() for c in media.rtp.codecs}
        if not ours & theirs:
            raise BadRequest(
                f"no common {media.kind} codec: the offer has {sorted(theirs)}, this server "
                f"supports {sorted(ours)}"
            )


ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")  # RFC 8839 ice-char


FINGERPRINT = re.compile(r"([0-9A-Fa-f]{2}:)*[0-9A-Fa-f]{2}")


HASHES = {"sha-1", "sha-224", "sha-256", "sha-384", "sha-512"}


def check_offer_transport(sdp: str) -> None:
    """Refuse, before a slot is taken, an offer that could never connect: every media
    section needs ICE credentials (RFC 8839: ufrag of 4+, pwd of 22+ ice-chars) and a DTLS
    certificate fingerprint (RFC 8122), at session or media level."""
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadRequest(f"the offer's SDP does not parse: {reason_of(exc)}") from exc
    for media in desc.media:
        where = f"the offer's {media.kind} section"
        ice = media.ice
        ufrag, pwd = (ice.usernameFragment, ice.password) if ice else (None, None)
        if not ufrag or not pwd:
            raise BadRequest(f"{where} has no ICE credentials (a=ice-ufrag and a=ice-pwd)")
        if not (4 <= len(ufrag) <= 256 and 22 <= len(pwd) <= 256):
            raise BadRequest(f"{where}: ice-ufrag needs 4-256 and ice-pwd 22-256 characters")
        if not (ICE_CHARS.fullmatch(ufrag) and ICE_CHARS.fullmatch(pwd)):
            raise BadRequest(f"{where}: ice-ufrag and ice-pwd may use only A-Z a-z 0-9 + /")
        prints = media.dtls.fingerprints if media.dtls else []
        if not prints:
            raise BadRequest(f"{where} has no DTLS fingerprint (a=fingerprint:sha-256 ...)")
        for fp in prints:
            if fp.algorithm.lower() not in HASHES or not FINGERPRINT.fullmatch(fp.value):
                raise BadRequest(
                    f"{where} has an unusable fingerprint {fp.algorithm} {fp.value[:100]!r}"
                )


def reason_of(exc: BaseException) -> str:
    """An exception's message, or its type when it has none (aiortc's SDP parser raises
    bare AssertionErrors on malformed lines)."""
    return str(exc) or f"{type(exc).__name__} on a malformed line"


def check_answer(sdp: str) -> None:
    """aiortc rejects a media section it shares no codec with by giving it port 0."""
    for line in sdp.splitlines():
        if line.startswith(("m=audio 0 ", "m=video 0 ")):
            kind = line[2:7]
            raise BadRequest(f"no common {kind} codec: offer Opus (audio) and VP8 or H264 (video)")


async def json_body(request: web.Request) -> dict:
    raw = await read_body(request, request.app[CONFIG].security.body_timeout_s)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    except RecursionError:
        raise BadRequest("body is not usable JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


@dataclass
class OfferRequest:
    description: RTCSessionDescription
    seed: int = 0
    kvs_stream: str | None = None  # this session's KVS stream name (mirroring servers)
    photo: Reference | None = (
        None  # the session's own checked photo (realtime/photos.py); None: the server's
    )


def parse_offer(body: dict, kvs: bool) -> OfferRequest:
    unknown = set(body) - OFFER_OPTIONS
    if unknown:
        raise BadRequest(f"unknown fields {sorted(unknown)}; allowed: {sorted(OFFER_OPTIONS)}")
    sdp, kind, seed = body.get("sdp"), body.get("type"), body.get("seed", 0)
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise BadRequest("'sdp' must be the offer's SDP text (starting with 'v=0')")
    if kind != "offer":
        raise BadRequest("'type' must be 'offer'")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise BadRequest("'seed' must be an integer in [0, 2**31)")
    if "m=audio" not in sdp:
        raise BadRequest(
            "the offer has no audio track: add the microphone (or an audio "
            "transceiver) before creating the offer"
        )
    check_offer_transport(sdp)
    stream = body.get("kvs_stream")
    if stream is not None:
        if not kvs:
            raise BadRequest(
                "'kvs_stream' given, but this server does not mirror to KVS "
                "(start it with --kvs-stream)"
            )
        try:
            check_stream_name(stream if isinstance(stream, str) else "")
        except KvsConfigError as exc:
            raise BadRequest(str(exc)) from exc
    return OfferRequest(RTCSessionDescription(sdp=sdp, type="offer"), seed, stream)


def session_from_request(request: web.Request) -> PeerSession:
    sid = request.match_info["id"]
    session = request.app[SERVICE].sessions.get(sid)
    if session is None:
        raise SessionNotFound(f"no live session {sid!r}")
    return session


async def close_service(service: Service, reason: str = "server shutting down") -> None:
    """End every session, then the engine's process (if it has one)."""
    sessions = list(service.sessions.values())
    await asyncio.gather(*(s.close(reason) for s in sessions), return_exceptions=True)
    if isinstance(service.engine, EngineProcess):
        await asyncio.to_thread(service.engine.close)


def kvs_sink_factory(options: KvsOptions) -> SinkFactory:
    """Each session mirrored to its own KVS stream: the offer's `kvs_stream`, else the
    server's --kvs-stream name, then NAME-2, NAME-3, …"""
    assert options.stream is not None
    options.validate(FPS)  # fail at start-up, not at the first call
    namer = StreamNamer(options.stream)

    async def attach(session: PeerSession) -> MediaSink:
        name = namer.next_name(session.offer_options.get("kvs_stream"))
        width, height = session.video_size
        mirror = KvsMirror(options, name, width, height, fps=FPS, registry=session.metrics.registry)
        await mirror.start()
        return mirror

    return attach


def load_reference(
    path: str | None, cfg: FacecastConfig, face_box: tuple[float, float, float, float] | None = None
) -> Reference:
    """The identity image as uint8 (H, W, 3) at the engine's size; for the photo stack the
    photo checked, framed (around `face_box`, its pixels, when given) and measured once
    (`PreparedPhoto`, video-sized), so sessions neither detect the face again nor carry a
    large photo to the engine process."""
    from pipeline.media import default_reference
    from pipeline.media import load_reference as load

    width, height = cfg.video.width, cfg.video.height
    if path is None:
        packaged = default_reference(cfg)
        if not packaged.exists():
            return _placeholder_reference(width, height)
        path = str(packaged)
    if cfg.runtime.stack == "photo":
        from pipeline.photo.reference import load_prepared

        return load_prepared(path, cfg, face_box)
    rgb = load(path, cfg, face_box)
    if rgb.shape[:2] != (height, width):
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        rgb = frame.to_ndarray(width=width, height=height, format="rgb24")
    return rgb


def _placeholder_reference(width: int, height: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    face = (
        (x - width / 2) ** 2 / (0.3 * width) ** 2 + (y - height / 2) ** 2 / (0.4 * height) ** 2
    ) < 1
    img = np.full((height, width, 3), (70, 90, 120), np.uint8)
    img[face] = (224, 180, 150)
    return img
