"""The aiohttp app: the web page, WebRTC signalling, session control, health and metrics.

Routes (all but the page need `Authorization: Bearer TOKEN` when a token is set):
    GET  /                          the web client (webclient/index.html)
    POST /offer                     {sdp, type: "offer", seed?} → {sdp, type, session_id}
    GET  /sessions                  live sessions
    DELETE /sessions/{id}           close one
    POST /sessions/{id}/interrupt   flush queued speech → {played_ms}
    GET  /healthz                   {status, sessions, max_sessions}
    GET  /metrics                   Prometheus text format

`facecast serve` calls `add_arguments` and `main`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.codecs import CODECS
from aiortc.sdp import SessionDescription

from pipeline.config import DEFAULT_CONFIG
from realtime.errors import BadRequest, RealtimeError, ServerFull, SessionNotFound, Unauthorized
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
from realtime.session import Session, SessionConfig
from realtime.tracks import FPS, MediaSink
from realtime.vad import VoiceActivityDetector

WEBCLIENT = Path(__file__).resolve().parent.parent / "webclient"
OFFER_OPTIONS = {"sdp", "type", "seed", "kvs_stream"}
log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    config: str = "tiny"  # engine preset name or YAML path
    host: str = "127.0.0.1"
    port: int = 8080
    max_sessions: int = 4
    token: str | None = None
    reference: str | None = None  # image file; default: the engine's packaged reference
    device: str = "cpu"
    max_body_bytes: int = 64 * 1024  # an SDP offer is a few KiB
    session: SessionConfig = field(default_factory=SessionConfig)
    kvs: KvsOptions | None = None  # mirror every session to Kinesis Video Streams


# Called for each new session; returns a started sink (or None) that receives the output
# frames and audio, e.g. `realtime.kvs.KvsMirror`. The session closes it when it ends.
SinkFactory = Callable[[Session], Awaitable[MediaSink | None]]


class Service:
    """Everything one app instance owns: engine, sessions, metrics. Stored on the app."""

    def __init__(
        self, config: ServerConfig, engine: Any, sink_factories: Sequence[SinkFactory] = ()
    ) -> None:
        self.config = config
        self.engine = engine
        self.sink_factories = list(sink_factories)
        self.metrics = RealtimeMetrics()
        self.sessions: dict[str, Session] = {}
        self.reserved = 0  # offers being negotiated count against capacity
        self.engine_lock = threading.Lock()  # one generate_ready() at a time per engine
        self.reference: np.ndarray | None = None

    def video_size(self) -> tuple[int, int]:
        video = self.engine.cfg.video
        return int(video.width), int(video.height)

    def open_engine_session(self, seed: int) -> Any:
        if self.reference is None:
            self.reference = load_reference(self.config.reference, *self.video_size())
        return self.engine.new_session(self.reference, seed=seed)

    async def on_session_closed(self, session: Session) -> None:
        if self.sessions.pop(session.id, None) is not None:
            self.metrics.active_sessions.set(len(self.sessions))


SERVICE = web.AppKey("facecast", Service)


def build_app(
    config: ServerConfig, engine: Any, sink_factories: Sequence[SinkFactory] = ()
) -> web.Application:
    """The app around a loaded engine; `sink_factories` attach mirrors to each session."""
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[_errors, _auth])
    factories = list(sink_factories)
    if config.kvs is not None:
        factories.append(kvs_sink_factory(config.kvs))
    app[SERVICE] = Service(config, engine, factories)
    app.router.add_get("/", _page)
    app.router.add_static("/static/", WEBCLIENT, show_index=False)
    app.router.add_post("/offer", _offer)
    app.router.add_get("/sessions", _list_sessions)
    app.router.add_delete("/sessions/{id}", _delete_session)
    app.router.add_post("/sessions/{id}/interrupt", _interrupt)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.on_shutdown.append(_close_all)
    return app


# ---- middlewares ---------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except RealtimeError as exc:
        return web.json_response({"error": str(exc)}, status=exc.status)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SERVICE].config.max_body_bytes
        return web.json_response({"error": f"body larger than {limit} bytes"}, status=413)


@web.middleware
async def _auth(request: web.Request, handler):
    token = request.app[SERVICE].config.token
    public = request.path == "/" or request.path.startswith("/static/")
    if token and not public:
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise Unauthorized("missing or wrong token: send 'Authorization: Bearer <token>'")
    return await handler(request)


# ---- handlers ------------------------------------------------------------------------


async def _page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEBCLIENT / "index.html")


async def _offer(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body = await _json_body(request)
    offer = _parse_offer(body, kvs=service.config.kvs is not None)
    if len(service.sessions) + service.reserved >= service.config.max_sessions:
        service.metrics.sessions_rejected.inc()
        raise ServerFull(
            f"server full: {service.config.max_sessions} sessions are live; try again later"
        )
    service.reserved += 1
    try:
        session = await _negotiate(service, offer)
    finally:
        service.reserved -= 1
    answer = session.pc.localDescription
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session.id})


async def _negotiate(service: Service, request: OfferRequest) -> Session:
    offer = request.description
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # loopback/LAN: no STUN
    session_config = SessionConfig(**{**service.config.session.__dict__, "seed": request.seed})
    vad = await asyncio.to_thread(VoiceActivityDetector)  # loads its model: off the loop
    session = Session(
        secrets.token_urlsafe(18),
        pc,
        service.open_engine_session,
        service.video_size(),
        session_config,
        service.metrics,
        service.on_session_closed,
        vad,
        service.engine_lock,
    )
    try:
        _check_codecs(offer.sdp)
        await pc.setRemoteDescription(offer)
        _check_transceivers(pc)
        pc.addTrack(session.audio)
        pc.addTrack(session.video)
        answer = await pc.createAnswer()
        await pc.setLocalDescription(answer)
        _check_answer(pc.localDescription.sdp)
    except BadRequest:
        await session.close("offer refused")
        raise
    except Exception as exc:  # aiortc raises ValueError and friends on unusable offers
        await session.close("offer refused")
        raise BadRequest(f"cannot negotiate the offer: {exc}") from exc
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


def _check_transceivers(pc: RTCPeerConnection) -> None:
    kinds = {t.kind for t in pc.getTransceivers()}
    if "audio" not in kinds:
        raise BadRequest(
            "the offer has no audio track: add the microphone (or an audio "
            "transceiver) before creating the offer"
        )
    if "video" not in kinds:
        raise BadRequest(
            "the offer has no video transceiver: add one (recvonly) to receive the avatar"
        )


def _check_codecs(sdp: str) -> None:
    """Refuse early, with a reason, when the offer shares no codec with aiortc."""
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadRequest(f"the offer's SDP does not parse: {exc}") from exc
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


def _check_answer(sdp: str) -> None:
    """aiortc rejects a media section it shares no codec with by giving it port 0."""
    for line in sdp.splitlines():
        if line.startswith(("m=audio 0 ", "m=video 0 ")):
            kind = line[2:7]
            raise BadRequest(f"no common {kind} codec: offer Opus (audio) and VP8 or H264 (video)")


async def _json_body(request: web.Request) -> dict:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


@dataclass
class OfferRequest:
    description: RTCSessionDescription
    seed: int = 0
    kvs_stream: str | None = None  # this session's KVS stream name (mirroring servers)


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


def _session(request: web.Request) -> Session:
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
    service = request.app[SERVICE]
    return web.json_response(
        {
            "status": "ok",
            "sessions": len(service.sessions),
            "max_sessions": service.config.max_sessions,
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    service.metrics.queue_depth.set(sum(s.frames.depth() for s in service.sessions.values()))
    return web.Response(
        body=service.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def _close_all(app: web.Application) -> None:
    sessions = list(app[SERVICE].sessions.values())
    await asyncio.gather(
        *(s.close("server shutting down") for s in sessions), return_exceptions=True
    )


def kvs_sink_factory(options: KvsOptions) -> SinkFactory:
    """Each session mirrored to its own KVS stream: the offer's `kvs_stream`, else the
    server's --kvs-stream name, then NAME-2, NAME-3, …"""
    assert options.stream is not None
    options.validate(FPS)  # fail at start-up, not at the first call
    namer = StreamNamer(options.stream)

    async def attach(session: Session) -> MediaSink:
        name = namer.next_name(session.offer_options.get("kvs_stream"))
        width, height = session.video_size
        mirror = KvsMirror(options, name, width, height, fps=FPS, registry=session.metrics.registry)
        await mirror.start()
        return mirror

    return attach


# ---- reference image -----------------------------------------------------------------


def load_reference(path: str | None, width: int, height: int) -> np.ndarray:
    """The identity image as uint8 (H, W, 3) at the engine's size."""
    from pipeline.media import load_image

    if path is None:
        packaged = Path(__file__).resolve().parent.parent / "pipeline" / "assets" / "reference.png"
        if not packaged.exists():
            return _placeholder_reference(width, height)
        path = str(packaged)
    rgb = load_image(path)
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
    """Options of `facecast serve`."""
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="engine preset name or YAML path")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--max-sessions", type=int, default=4, help="concurrent peers; more get HTTP 503"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("FACECAST_TOKEN"),
        help="require 'Authorization: Bearer TOKEN' (env FACECAST_TOKEN)",
    )
    parser.add_argument("--reference", default=None, help="identity image (PNG/JPEG)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda if present)")
    parser.add_argument(
        "--lead-ms", type=int, default=2000, help="how far generation may run ahead of playout"
    )
    add_kvs_arguments(parser)
    parser.add_argument(
        "--jitter-ms",
        type=int,
        default=800,
        help="playout starts this long after the first frames exist (covers engine bursts)",
    )


def main(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.engine import Engine
    from pipeline.module import resolve_device

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.device = resolve_device(args.device)
    if args.max_sessions < 1:
        raise SystemExit("--max-sessions must be >= 1")
    config = ServerConfig(
        config=args.config,
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        token=args.token or None,
        reference=args.reference,
        device=args.device,
        session=SessionConfig(lead_s=args.lead_ms / 1000, jitter_s=args.jitter_ms / 1000),
    )
    kvs = options_from_args(args)
    if kvs.enabled:
        config.kvs = kvs
    log.info("loading engine %s on %s", config.config, config.device)
    engine = Engine.load(load_config(config.config), device=config.device)
    try:
        app = build_app(config, engine)
    except KvsConfigError as exc:
        raise SystemExit(f"facecast serve: {exc}") from None
    # run_app turns SIGINT/SIGTERM into a graceful exit: on_shutdown closes every peer.
    web.run_app(app, host=config.host, port=config.port, print=log.info)
    return 0
