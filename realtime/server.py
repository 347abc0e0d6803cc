"""The aiohttp app: the web page, WebRTC signalling, session control, health and metrics.

Routes (all but the page need `Authorization: Bearer TOKEN` when a token is set):
    GET  /                          the web client (webclient/index.html)
    POST /offer                     {sdp, type: "offer", seed?} → {sdp, type, session_id}
    GET  /sessions                  live sessions
    DELETE /sessions/{id}           close one
    POST /sessions/{id}/interrupt   flush queued speech → {played_ms}
    POST /whip, DELETE /whip/{id}   WHIP ingest, RFC 9725 (realtime/whip.py)
    GET  /healthz                   {status: starting|ok|failed, sessions, max_sessions,
                                     startup_seconds}; 503 until the engine is warm
    GET  /metrics                   Prometheus text format

`facecast serve` (the `facecast` package's CLI) calls `add_arguments` and `serve`. The
server listens at once; the engine starts (load, compile, warm-up: `pipeline.startup`) in a
worker thread meanwhile, and offers are refused with 503 until it is ready.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import mimetypes
import os
import re
import secrets
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch
from aiohttp import web
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.codecs import CODECS
from aiortc.sdp import SessionDescription

from pipeline.clock import FPS
from pipeline.startup import EngineOptions, start_engine
from pipeline.stream import AvatarStream, StreamingEngine
from realtime.dtls import allow_rsa_peers
from realtime.edge import run_app
from realtime.engine_process import EngineProcess
from realtime.errors import (
    BadRequest,
    EngineStarting,
    RealtimeError,
    ServerFull,
    SessionNotFound,
    Unauthorized,
)
from realtime.ice_servers import add_ice_arguments, ice_servers_from_args
from realtime.kvs import (
    KvsConfigError,
    KvsMirror,
    KvsOptions,
    StreamNamer,
    add_kvs_arguments,
    options_from_args,
)
from realtime.kvs.options import check_stream_name
from realtime.metrics import CONTENT_TYPE_LATEST, RealtimeMetrics
from realtime.photos import PhotoStore, offer_photo
from realtime.photos import upload as upload_photo
from realtime.playout import EngineTiming
from realtime.security import (
    SecurityConfig,
    add_security_arguments,
    read_body,
    redact_access_log,
    same_origin_guard,
    security_from_args,
)
from realtime.session import PeerSession, SessionConfig
from realtime.tracks import MediaSink
from realtime.vad import VoiceActivityDetector

WEBCLIENT = Path(__file__).resolve().parent.parent / "webclient"
OFFER_OPTIONS = {"sdp", "type", "seed", "kvs_stream", "photo_id", "photo"}
log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_sessions: int = 4
    token: str | None = None
    reference: str | None = None  # image file; default: the engine's packaged reference
    # `serve`: the engine in its own process (None: on a CPU, where it measured 35-50%
    # faster steps beside the media loop; not on a GPU, where the frames' trip through
    # shared memory cost 0.07-0.14 s a 720p step and in-process steps matched bench)
    engine_process: bool | None = None
    max_body_bytes: int = 64 * 1024  # an SDP offer is a few KiB
    session: SessionConfig = field(default_factory=SessionConfig)
    kvs: KvsOptions | None = None  # mirror every session to Kinesis Video Streams
    ice_servers: list[RTCIceServer] = field(default_factory=list)  # advertised to WHIP clients
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
        self.reserved = 0  # offers being negotiated count against capacity
        self.engine_lock = threading.Lock()  # one generate_ready() at a time per engine
        self.reference: Any = None  # the server's identity (realtime.server.load_reference)
        self.photos = PhotoStore()  # the page's uploads (realtime/photos.py)

    @property
    def state(self) -> str:
        if self.engine is not None:
            return "ok"
        return "failed" if self.startup_error else "starting"

    async def start_engine(self, options: EngineOptions, own_process: bool | None = None) -> None:
        """Start the engine off the event loop, in a process of its own unless told not to
        (`realtime.engine_process`); sessions are refused until it is warm."""
        if own_process is None:
            own_process = options.device == "cpu"
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

    def video_size(self) -> tuple[int, int]:
        video = self.warm_engine().cfg.video
        return int(video.width), int(video.height)

    def open_engine_stream(self, seed: int, photo: Any = None) -> AvatarStream:
        """An engine stream of the server's reference, or of the offer's own photo."""
        engine = self.warm_engine()
        if photo is not None:
            return engine.new_stream(photo, seed=seed)
        if self.reference is None:
            self.reference = load_reference(self.config.reference, engine.cfg)
        return engine.new_stream(self.reference, seed=seed)

    async def on_session_closed(self, session: PeerSession) -> None:
        if self.sessions.pop(session.id, None) is not None:
            self.metrics.active_sessions.set(len(self.sessions))


SERVICE = web.AppKey("facecast", Service)


def build_app(
    config: ServerConfig,
    engine: StreamingEngine | None,
    sink_factories: Sequence[SinkFactory] = (),
) -> web.Application:
    """The app around a loaded engine; `sink_factories` attach mirrors to each session."""
    allow_rsa_peers()  # GStreamer's webrtcbin has an RSA certificate (realtime/dtls.py)
    guard = same_origin_guard(config.token, config.host, config.security)
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[_errors, guard, _auth],
        handler_args=config.security.handler_args(),
    )
    redact_access_log()
    factories = list(sink_factories)
    if config.kvs is not None:
        factories.append(kvs_sink_factory(config.kvs))
    app[SERVICE] = Service(config, engine, factories)
    app.router.add_get("/", _page)
    app.router.add_get("/static/{name}", _static)
    app.router.add_post("/offer", _offer)
    app.router.add_post("/photos", _upload_photo)
    app.router.add_get("/sessions", _list_sessions)
    app.router.add_delete("/sessions/{id}", _delete_session)
    app.router.add_post("/sessions/{id}/interrupt", _interrupt)
    from realtime.whip import add_whip_routes  # whip.py builds on open_session below

    add_whip_routes(app)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.on_shutdown.append(_close_all)
    return app


# ---- middlewares ---------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler):
    """Every error answers JSON with a reason; an unexpected exception is a logged 500."""
    try:
        return await handler(request)
    except RealtimeError as exc:
        response = web.json_response({"error": str(exc)}, status=exc.status)
        if exc.status == 408:  # the rest of the body may never come: do not wait for it
            response.force_close()
        return response
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SERVICE].config.max_body_bytes
        return web.json_response({"error": f"body larger than {limit} bytes"}, status=413)
    except web.HTTPException as exc:  # the router's 404 and 405, static files' 403/404
        if exc.status < 400:
            raise
        return web.json_response(
            {"error": _http_reason(request, exc)}, status=exc.status, headers=_allow(exc)
        )
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": "internal server error"}, status=500)


def _http_reason(request: web.Request, exc: web.HTTPException) -> str:
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return f"method {request.method} is not allowed on {request.path}; use {allowed}"
    if isinstance(exc, web.HTTPNotFound):
        return f"no such resource: {request.path}"
    return exc.reason


def _allow(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}


@web.middleware
async def _auth(request: web.Request, handler):
    token = request.app[SERVICE].config.token
    public = request.path == "/" or request.path.startswith("/static/")
    if token and not public:
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        # Header bytes that are not UTF-8 arrive as surrogate escapes: compare them as bytes.
        if not secrets.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
            raise Unauthorized("missing or wrong token: send 'Authorization: Bearer <token>'")
    return await handler(request)


# ---- handlers ------------------------------------------------------------------------


async def _page(request: web.Request) -> web.Response:
    return _webclient_file("index.html")


async def _static(request: web.Request) -> web.Response:
    return _webclient_file(request.match_info["name"])


def _webclient_file(name: str) -> web.Response:
    """One file of the page, whole (a few KiB: no ranges or conditional requests, so no
    answer of aiohttp's file sender can bypass the JSON errors); nothing outside it."""
    files = {p.name: p for p in WEBCLIENT.iterdir() if p.is_file() and p.name[0] != "."}
    path = files.get(name)  # the name never reaches the file system
    if path is None:
        raise web.HTTPNotFound()
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    charset = "utf-8" if kind.startswith("text/") else None
    return web.Response(body=path.read_bytes(), content_type=kind, charset=charset)


async def _offer(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    require_engine(service)
    body = await _json_body(request)
    offer = _parse_offer(body, kvs=service.config.kvs is not None)
    offer.photo = await offer_photo(service, body)  # checked before it takes a slot
    session = await open_session(service, offer)
    answer = session.pc.localDescription
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session.id})


async def _upload_photo(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    require_engine(service)
    return await upload_photo(request, service)


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
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # loopback/LAN: no STUN
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
        _check_codecs(offer.sdp)
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
        _check_answer(pc.localDescription.sdp)
    except BadRequest:
        await session.close("offer refused")
        raise
    except Exception as exc:  # aiortc raises ValueError and friends on unusable offers
        await session.close("offer refused")
        raise BadRequest(f"cannot negotiate the offer: {_reason(exc)}") from exc
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


def _check_codecs(sdp: str) -> None:
    """Refuse early, with a reason, when the offer shares no codec with aiortc."""
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadRequest(f"the offer's SDP does not parse: {_reason(exc)}") from exc
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


def _check_offer_transport(sdp: str) -> None:
    """Refuse, before a slot is taken, an offer that could never connect: every media
    section needs ICE credentials (RFC 8839: ufrag of 4+, pwd of 22+ ice-chars) and a DTLS
    certificate fingerprint (RFC 8122), at session or media level."""
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadRequest(f"the offer's SDP does not parse: {_reason(exc)}") from exc
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


def _reason(exc: BaseException) -> str:
    """An exception's message, or its type when it has none (aiortc's SDP parser raises
    bare AssertionErrors on malformed lines)."""
    return str(exc) or f"{type(exc).__name__} on a malformed line"


def _check_answer(sdp: str) -> None:
    """aiortc rejects a media section it shares no codec with by giving it port 0."""
    for line in sdp.splitlines():
        if line.startswith(("m=audio 0 ", "m=video 0 ")):
            kind = line[2:7]
            raise BadRequest(f"no common {kind} codec: offer Opus (audio) and VP8 or H264 (video)")


async def _json_body(request: web.Request) -> dict:
    raw = await read_body(request, request.app[SERVICE].config.security.body_timeout_s)
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
    photo: Any = None  # the session's own checked photo (realtime/photos.py); None: the server's


def _parse_offer(body: dict, kvs: bool) -> OfferRequest:
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
    _check_offer_transport(sdp)
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


def _session(request: web.Request) -> PeerSession:
    sid = request.match_info["id"]
    session = request.app[SERVICE].sessions.get(sid)
    if session is None:
        raise SessionNotFound(f"no live session {sid!r}")
    return session


async def _list_sessions(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response({"sessions": [s.describe() for s in service.sessions.values()]})


async def _delete_session(request: web.Request) -> web.Response:
    session = _session(request)
    await session.close("deleted by the API")
    return web.json_response({"closed": session.id})


async def _interrupt(request: web.Request) -> web.Response:
    return web.json_response({"played_ms": _session(request).interrupt()})


async def _healthz(request: web.Request) -> web.Response:
    """200 once the engine is warm; 503 while it starts (or after it failed to)."""
    service = request.app[SERVICE]
    body: dict[str, Any] = {
        "status": service.state,
        "sessions": len(service.sessions),
        "max_sessions": service.config.max_sessions,
    }
    if service.engine is not None:
        body["startup_seconds"] = round(service.startup_seconds, 3)
    else:
        body["starting_for_s"] = round(time.monotonic() - service.startup_began, 1)
        if service.startup_error:
            body["error"] = service.startup_error
    return web.json_response(body, status=200 if service.engine is not None else 503)


async def _metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    service.metrics.queue_depth.set(sum(s.frames.depth() for s in service.sessions.values()))
    device = getattr(service.engine, "device", None)
    if isinstance(service.engine, EngineProcess):
        peak = await asyncio.to_thread(service.engine.gpu_memory_peak)  # may wait for a step
        if peak is not None:
            service.metrics.gpu_memory.set(peak)
    elif device is not None and device.type == "cuda":
        service.metrics.gpu_memory.set(torch.cuda.max_memory_allocated(device))
    return web.Response(
        body=service.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def _close_all(app: web.Application) -> None:
    service = app[SERVICE]
    sessions = list(service.sessions.values())
    await asyncio.gather(
        *(s.close("server shutting down") for s in sessions), return_exceptions=True
    )
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


# ---- reference image -----------------------------------------------------------------


def load_reference(path: str | None, cfg) -> Any:
    """The identity image as uint8 (H, W, 3) at the engine's size; for the photo stack the
    photo checked, framed and measured once (`PreparedPhoto`, video-sized), so sessions
    neither detect the face again nor carry a large photo to the engine process."""
    from pipeline.media import default_reference
    from pipeline.media import load_reference as load

    width, height = cfg.video.width, cfg.video.height
    if path is None:
        packaged = default_reference(cfg)
        if not packaged.exists():
            return _placeholder_reference(width, height)
        path = str(packaged)
    rgb = load(path, cfg)
    if cfg.runtime.stack == "photo":
        from pipeline.photo.face import prepare_photo

        return prepare_photo(rgb, width, height, cfg.photo)
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


# ---- command line --------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's own options of `facecast serve` (the engine's come from the CLI)."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--max-sessions", type=int, default=4, help="concurrent peers; more get HTTP 503"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("FACECAST_TOKEN"),
        help="require 'Authorization: Bearer TOKEN'; prefer the env FACECAST_TOKEN, since a "
        "command line is visible to every local user (ps)",
    )
    parser.add_argument("--reference", default=None, help="identity image (PNG/JPEG)")
    parser.add_argument(
        "--lead-ms", type=int, default=2000, help="how far generation may run ahead of playout"
    )
    parser.add_argument(
        "--playout-margin-ms",
        type=int,
        default=100,
        help="added to the playout budget (schedule + measured step times)",
    )
    parser.add_argument(
        "--playout-delay-ms",
        type=int,
        default=None,
        help="a fixed delay from first audio to first frame instead of the budget",
    )
    parser.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the engine in its own process, off the media loop's GIL "
        "(default: on a CPU, not on a GPU; see bench/RESULTS.md)",
    )
    add_kvs_arguments(parser)
    add_ice_arguments(parser)
    add_security_arguments(parser)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from parsed flags; ValueError names a bad value."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be in [0, 65535]")
    if args.max_sessions < 1:
        raise ValueError(f"--max-sessions {args.max_sessions}: must be >= 1")
    if args.lead_ms < 200:
        raise ValueError(f"--lead-ms {args.lead_ms}: must be >= 200")
    if not 0 <= args.playout_margin_ms <= 5000:
        raise ValueError(f"--playout-margin-ms {args.playout_margin_ms}: must be in [0, 5000]")
    if args.playout_delay_ms is not None and not 0 <= args.playout_delay_ms <= 30_000:
        raise ValueError(f"--playout-delay-ms {args.playout_delay_ms}: must be in [0, 30000]")
    if args.reference is not None and not Path(args.reference).is_file():
        raise ValueError(f"--reference {args.reference}: file not found")
    delay = None if args.playout_delay_ms is None else args.playout_delay_ms / 1000
    config = ServerConfig(
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        token=args.token or None,
        reference=args.reference,
        engine_process=args.engine_process,
        session=SessionConfig(
            lead_s=args.lead_ms / 1000,
            playout_margin_s=args.playout_margin_ms / 1000,
            playout_delay_s=delay,
        ),
        security=security_from_args(args),
    )
    config.ice_servers = ice_servers_from_args(args)
    kvs = options_from_args(args)
    if kvs.enabled:
        try:
            kvs.validate(FPS)
        except KvsConfigError as exc:
            raise ValueError(str(exc)) from None
        config.kvs = kvs
    return config


def serve(config: ServerConfig, engine_options: EngineOptions) -> int:
    """Listen now, start the engine meanwhile; run until SIGINT/SIGTERM. Exit status 2 if
    the engine cannot start."""
    app = build_app(config, engine=None)
    service = app[SERVICE]
    url = f"http://{config.host}:{config.port}/"

    async def start(app: web.Application) -> None:
        print(f"facecast serve: {url} (starting the {engine_options.config} engine)", flush=True)

        async def warm() -> None:
            await service.start_engine(engine_options, config.engine_process)
            if service.engine is None:
                print(f"facecast serve: error: {service.startup_error}", file=sys.stderr)
                signal.raise_signal(signal.SIGTERM)  # run_app's graceful exit
                return
            steps = service.engine.step_seconds or {}
            print(
                f"facecast serve: ready in {service.startup_seconds:.1f} s at {url} "
                f"(a step takes {steps.get('first', 0):.3f} s first, "
                f"{steps.get('steady', 0):.3f} s after)",
                flush=True,
            )

        app["startup_task"] = asyncio.get_running_loop().create_task(warm())

    app.on_startup.append(start)
    # run_app turns SIGINT/SIGTERM into a graceful exit: on_shutdown closes every peer.
    run_app(app, host=config.host, port=config.port, print=None)
    return 0 if service.startup_error is None else 2
