"""The aiohttp app: the web page, WebRTC signalling, session control, health and metrics.

Routes (all but the page need `Authorization: Bearer TOKEN` when a token is set):
    GET  /                          the web client (webclient/index.html)
    POST /offer                     {sdp, type: "offer", seed?, photo_id?} → {sdp, type, session_id}
    POST /photos                    a photo for a session (photo stack; realtime/photos.py)
    GET  /sessions                  live sessions
    DELETE /sessions/{id}           close one
    POST /sessions/{id}/interrupt   flush queued speech → {played_ms}
    GET  /sessions/{id}/speech      WebSocket: the utterance channel (realtime/speech_ws.py)
    POST /whip, DELETE /whip/{id}   WHIP ingest, RFC 9725 (realtime/whip.py)
    POST /whep/{id}, DELETE /whep/{id}/{viewer}   WHEP viewers of a session (realtime/whep/)
    GET  /healthz                   {status: starting|ok|failed, sessions, max_sessions, free,
                                     capacity, startup_seconds}; 503 until the engine is warm
    GET  /metrics                   Prometheus text format

`facecast serve` (the `facecast` package's CLI) calls `add_arguments` and `serve`. The
server listens at once; the engine starts (load, compile, warm-up: `pipeline.startup`) in a
worker thread meanwhile, and offers are refused with 503 until it is ready.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import mimetypes
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from pipeline.clock import FPS
from pipeline.faces.face_box import FACE_BOX_HELP, face_box_arg
from pipeline.startup import EngineOptions
from pipeline.stream import StreamingEngine
from realtime.dtls import allow_rsa_peers
from realtime.edge import run_app
from realtime.errors import (
    RealtimeError,
    Unauthorized,
)
from realtime.ice_servers import add_ice_arguments, ice_servers_from_args
from realtime.kvs import (
    KvsConfigError,
    add_kvs_arguments,
    options_from_args,
)
from realtime.metrics import CONTENT_TYPE_LATEST
from realtime.negotiation import open_session
from realtime.offer import json_body, parse_offer, prompt_refusal
from realtime.photos import offer_photo
from realtime.photos import upload as upload_photo
from realtime.security import (
    add_security_arguments,
    redact_access_log,
    same_origin_guard,
    security_from_args,
)
from realtime.service import (
    CONFIG,
    SERVICE,
    ServerConfig,
    Service,
    close_service,
    require_engine,
    session_from_request,
)
from realtime.session_config import SessionConfig
from realtime.sinks import SinkFactory, kvs_sink_factory
from realtime.speech_ws import add_speech_routes
from realtime.whep import add_whep_routes
from realtime.whip import add_whip_routes

WEBCLIENT = Path(__file__).resolve().parent.parent / "webclient"


log = logging.getLogger(__name__)


def http_app(config: ServerConfig) -> web.Application:
    """The HTTP surface a server and a fleet front (`realtime.fleet.front`) share: JSON
    errors, the same-origin guard, the token, request limits, the page."""
    guard = same_origin_guard(config.token, config.host, config.security)
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[_errors, guard, _auth],
        handler_args=config.security.handler_args(),
    )
    redact_access_log()
    app[CONFIG] = config
    app.router.add_get("/", _page)
    app.router.add_get("/static/{name}", _static)
    return app


def build_app(
    config: ServerConfig,
    engine: StreamingEngine | None,
    sink_factories: Sequence[SinkFactory] = (),
) -> web.Application:
    """The app around a loaded engine; `sink_factories` attach mirrors to each session."""
    allow_rsa_peers()  # GStreamer's webrtcbin has an RSA certificate (realtime/dtls.py)
    app = http_app(config)
    factories = list(sink_factories)
    if config.kvs is not None:
        factories.append(kvs_sink_factory(config.kvs))
    app[SERVICE] = Service(config, engine, factories)
    app.router.add_post("/offer", _offer)
    app.router.add_post("/photos", _upload_photo)
    app.router.add_get("/sessions", _list_sessions)
    app.router.add_delete("/sessions/{id}", _delete_session)
    app.router.add_post("/sessions/{id}/interrupt", _interrupt)
    add_whip_routes(app)
    add_whep_routes(app)
    add_speech_routes(app)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.on_shutdown.append(_close_all)
    return app


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
        limit = request.app[CONFIG].max_body_bytes
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
    token = request.app[CONFIG].token
    public = request.path == "/" or request.path.startswith("/static/")
    if token and not public:
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        # Header bytes that are not UTF-8 arrive as surrogate escapes: compare them as bytes.
        if not secrets.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
            raise Unauthorized("missing or wrong token: send 'Authorization: Bearer <token>'")
    return await handler(request)


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
    body = await json_body(request)
    refusal = prompt_refusal(service) if "prompt" in body else None
    offer = parse_offer(body, kvs=service.config.kvs is not None, prompts=refusal)
    offer.photo = await offer_photo(service, body)  # checked before it takes a slot
    session = await open_session(service, offer)
    answer = session.pc.localDescription
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session.id})


async def _upload_photo(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    require_engine(service)
    return await upload_photo(request, service)


async def _list_sessions(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response({"sessions": [service.describe(s) for s in service.sessions.values()]})


async def _delete_session(request: web.Request) -> web.Response:
    session = session_from_request(request)
    await session.close("deleted by the API")
    return web.json_response({"closed": session.id})


async def _interrupt(request: web.Request) -> web.Response:
    return web.json_response({"played_ms": session_from_request(request).interrupt()})


async def _healthz(request: web.Request) -> web.Response:
    """200 once the engine is warm; 503 while it starts (or after it failed to)."""
    service = request.app[SERVICE]
    body: dict[str, Any] = {
        "status": service.state,
        "sessions": len(service.sessions),
        "max_sessions": service.max_sessions,
    }
    if service.engine is not None and service.engine.capacity is not None:
        body["capacity"] = service.engine.capacity  # sessions it measured it carries
    body["free"] = max(0, service.max_sessions - len(service.sessions) - service.reserved)
    if service.engine is not None:
        body["startup_seconds"] = round(service.startup_seconds, 3)
        counts = await asyncio.to_thread(service.engine.batching)  # may wait for its process
        if counts is not None:  # the batch size in use: how much the sessions share the GPU
            body["batches"], body["batched_steps"] = counts
    else:
        body["starting_for_s"] = round(time.monotonic() - service.startup_began, 1)
        body["phase"] = service.startup_phase  # e.g. the warm-up's compile, for minutes
        if service.startup_error:
            body["error"] = service.startup_error
    return web.json_response(body, status=200 if service.engine is not None else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = await metrics_text(request.app[SERVICE])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def metrics_text(service: Service) -> bytes:
    """The service's metrics in Prometheus text format, gauges read now."""
    service.metrics.queue_depth.set(sum(s.frames.depth() for s in service.sessions.values()))
    if service.engine is not None:
        memory = await asyncio.to_thread(service.engine.gpu_memory)  # may wait for a step
        if memory is not None:
            service.metrics.gpu_memory_now.set(memory[0])
            service.metrics.gpu_memory.set(memory[1])
        counts = await asyncio.to_thread(service.engine.batching)
        if counts is not None:
            service.metrics.engine_batches.set(counts[0])
            service.metrics.engine_batched_steps.set(counts[1])
    return service.metrics.render()


async def _close_all(app: web.Application) -> None:
    await close_service(app[SERVICE])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's own options of `facecast serve` (the engine's come from the CLI)."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        help="concurrent peers; more get HTTP 503 (default: as many as the engine measured "
        "at start-up that it carries at real time; 4 where it measures none)",
    )
    parser.add_argument(
        "--plan-sessions",
        type=int,
        default=None,
        help="plan every call's playout delay as if N calls' steps lined up on the engine: "
        "each call has from its start the delay it needs then, and drops no frames when an "
        "agent joins (default: the calls live at the time; microphones' calls take turns, "
        "each planned on a step of its own, and a call raises its delay at a pause only where "
        "calls cannot take turns)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("FACECAST_TOKEN"),
        help="require 'Authorization: Bearer TOKEN'; prefer the env FACECAST_TOKEN, since a "
        "command line is visible to every local user (ps)",
    )
    parser.add_argument("--reference", default=None, help="identity image (PNG/JPEG)")
    parser.add_argument(
        "--face-box", type=face_box_arg, default=None, help="--reference: " + FACE_BOX_HELP
    )
    parser.add_argument(
        "--max-viewers", type=int, default=16, help="WHEP viewers per session; more get 503"
    )
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


def _check_session_counts(max_sessions: int | None, plan_sessions: int | None) -> None:
    if max_sessions is not None and max_sessions < 1:
        raise ValueError(f"--max-sessions {max_sessions}: must be >= 1")
    if plan_sessions is not None and plan_sessions < 1:
        raise ValueError(f"--plan-sessions {plan_sessions}: must be >= 1")
    if plan_sessions is not None and max_sessions is not None and plan_sessions > max_sessions:
        raise ValueError(
            f"--plan-sessions {plan_sessions}: more than the {max_sessions} --max-sessions admits"
        )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from parsed flags; ValueError names a bad value."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be in [0, 65535]")
    _check_session_counts(args.max_sessions, args.plan_sessions)
    if args.max_viewers < 0:
        raise ValueError(f"--max-viewers {args.max_viewers}: must be >= 0")
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
        plan_sessions=args.plan_sessions,
        max_viewers=args.max_viewers,
        token=args.token or None,
        reference=args.reference,
        face_box=args.face_box,
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
        name, _ = engine_options.config_and_overrides()  # --model's, where it names one
        print(f"facecast serve: {url} (starting the {name} engine)", flush=True)

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
