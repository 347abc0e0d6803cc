"""The fleet's front: the page and the HTTP API of `facecast serve`, sessions on workers.

Routes (as the server's, with the same token, same-origin guard and request limits):
    GET  /                          the web client
    POST /offer                     placed on the worker with the most free slots →
                                    {sdp, type, session_id, worker, node_id, node_ip};
                                    503 with a reason when every worker is full; its
                                    photo (photo_id or inline) sent along (fleet/photos.py)
    POST /photos                    a photo for a session, checked here (fleet/photos.py)
    GET  /sessions                  every session of the cluster: worker, node, state, and
                                    for ended ones their final state and reason
    DELETE /sessions/{id}           ended on its worker, wherever it runs
    POST /sessions/{id}/interrupt   flushed on its worker → {played_ms}
    GET  /sessions/{id}/speech      the utterance WebSocket, relayed to its worker
                                    (fleet/speech_relay.py)
    POST /whip, DELETE|PATCH /whip/{id}, POST /whep/{id}, DELETE|PATCH /whep/{id}/{viewer}
                                    WHIP and WHEP, relayed to the session's worker
                                    (fleet/relay.py)
    GET  /workers                   the pool: state, node, slots of each worker
    POST /workers/{name}/drain      no new sessions there; it ends after its last one
    GET  /healthz                   ok (200) once a worker is ready; else 503 with reasons
    GET  /metrics                   the front's fleet gauges and every worker's metrics,
                                    labelled `worker`

The agent's data channel needs no route: it is part of the peer connection, which runs
between the caller and the session's worker. A worker that is gone or does not answer in
time is a JSON 503 that names it, never a wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from pipeline.errors import FacecastError
from pipeline.startup import EngineOptions
from realtime.edge import run_app
from realtime.fleet.answers import answer_of
from realtime.fleet.metrics import METRICS, FleetMetrics
from realtime.fleet.options import CPU_WORKER, FleetOptions
from realtime.fleet.photos import add_photo_routes, offer_photo
from realtime.fleet.pool import POOL, WorkerPool
from realtime.fleet.relay import add_relay_routes, place
from realtime.fleet.speech_relay import relay_speech
from realtime.metrics import CONTENT_TYPE_LATEST
from realtime.offer import json_body, parse_offer
from realtime.server import http_app
from realtime.service import ServerConfig

log = logging.getLogger(__name__)
REPORT = web.AppKey("facecast-fleet-report", asyncio.Task)


def build_front_app(config: ServerConfig, pool: WorkerPool) -> web.Application:
    """The front around a pool; starts the pool with the app and stops it after."""
    app = http_app(config)
    app[POOL] = pool
    app[METRICS] = metrics = FleetMetrics()
    pool.on_lost.append(lambda view: metrics.lost.inc())
    app.router.add_post("/offer", _offer)
    add_photo_routes(app, pool.engine_options)
    app.router.add_get("/sessions", _sessions)
    app.router.add_delete("/sessions/{id}", _delete)
    app.router.add_post("/sessions/{id}/interrupt", _interrupt)
    app.router.add_get("/sessions/{id}/speech", _speech)
    add_relay_routes(app)
    app.router.add_get("/workers", _workers)
    app.router.add_post("/workers/{name}/drain", _drain)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    return app


def worker_config(config: ServerConfig, options: FleetOptions) -> ServerConfig:
    """What each worker's server runs with: the front's session and mirror settings, the
    fleet's slots, and the ICE servers for its own peers (workers behind NAT)."""
    return dataclasses.replace(
        config,
        max_sessions=options.sessions_per_worker,
        token=None,  # workers take no HTTP: the front checks the token
        reference=None,  # sent as bytes, so no node needs the file
        peer_ice_servers=list(config.ice_servers),
    )


async def _offer(request: web.Request) -> web.Response:
    body = await json_body(request)
    pool = request.app[POOL]
    # the workers' config is read from disk: off the event loop
    refusal = await asyncio.to_thread(model_prompt_refusal, pool) if "prompt" in body else None
    offer = parse_offer(body, kvs=pool.worker_config.kvs is not None, prompts=refusal)
    photo = await offer_photo(request, body)  # checked before any worker is asked
    sdp = offer.description.sdp
    answer = await place(
        request.app, "offer", sdp, offer.seed, offer.kvs_stream, photo, offer.prompt
    )
    keep = ("sdp", "type", "session_id", "worker", "node_id", "node_ip")
    return web.json_response({k: answer[k] for k in keep})


async def _sessions(request: web.Request) -> web.Response:
    return web.json_response({"sessions": await request.app[POOL].sessions()})


async def _delete(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    session_id = request.match_info["id"]
    _, view = await pool.session_worker(session_id)
    answer = answer_of(await pool.on_worker(view, "close_session", session_id))
    pool.session_ended(view, session_id)
    return web.json_response(answer)


async def _interrupt(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    _, view = await pool.session_worker(request.match_info["id"])
    return web.json_response(
        answer_of(await pool.on_worker(view, "interrupt", request.match_info["id"]))
    )


async def _speech(request: web.Request) -> web.StreamResponse:
    return await relay_speech(request, request.app[POOL])


async def _workers(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    return web.json_response(
        {"workers": [v.describe() for v in pool.workers.values()], **pool.capacity()}
    )


async def _drain(request: web.Request) -> web.Response:
    return web.json_response(await request.app[POOL].drain(request.match_info["name"]))


async def _healthz(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    views = list(pool.workers.values())
    ready = any(v.state == "ok" for v in views)
    waiting = any(v.state in ("pending", "starting") for v in views)
    state = "ok" if ready else "starting" if waiting else "failed"
    live = sum(len(v.status.get("sessions", [])) for v in views if v.state in ("ok", "draining"))
    body: dict[str, Any] = {
        "status": state,
        "sessions": live,
        **pool.capacity(),
        "workers": [v.describe() for v in views],
    }
    reasons = [v.reason for v in views if v.reason]
    if reasons:
        body["errors"] = reasons
    return web.json_response(body, status=200 if ready else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = await request.app[METRICS].render(request.app[POOL])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# ---- start-up --------------------------------------------------------------------------


def connect(options: FleetOptions, local_resources: dict | None = None) -> None:
    """Join the Ray cluster at `options.address`, or start one on this machine. A cluster
    that cannot be reached is a FacecastError within `connect_timeout_s`, not a hang."""
    import ray

    # quiet: Ray's own INFO lines (connecting, dashboard) would bury the front's
    kwargs: dict[str, Any] = {
        "namespace": options.namespace,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if options.address is None:
        # In this thread: Ray's head processes die with the thread that started them
        # (their parent-death signal is per thread), and starting them cannot hang.
        ray.init(include_dashboard=False, resources=local_resources or {}, **kwargs)
        return
    _check_reachable(options.address, min(5.0, options.connect_timeout_s))
    kwargs["address"] = options.address
    failure: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as exc:  # handed to the caller below
            failure.append(exc)

    thread = threading.Thread(target=init, name="ray-init", daemon=True)
    thread.start()
    thread.join(options.connect_timeout_s)
    if thread.is_alive():
        raise FacecastError(
            f"the Ray cluster at {options.address} did not accept this front within "
            f"{options.connect_timeout_s:g} s"
        )
    if failure:
        raise FacecastError(f"cannot join the Ray cluster at {options.address}: {failure[0]}")


def _check_reachable(address: str, timeout: float) -> None:
    """Ray's own connect retries for a minute on a wrong address: look first."""
    if "://" in address or address == "auto":
        return  # ray://… (Ray Client) and auto resolve elsewhere
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise FacecastError(f"--ray-address {address!r}: use HOST:PORT (the head's GCS port)")
    try:
        socket.create_connection((host, int(port)), timeout).close()
    except OSError as exc:
        raise FacecastError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}; start one "
            "with `ray start --head` or give the head's address"
        ) from None


def model_prompt_refusal(pool: WorkerPool) -> str | None:
    """None when the workers' model reads a prompt, else why an offer's is refused (the
    front starts no engine: the config tells)."""
    from pipeline.config import load_config
    from pipeline.families import family_of

    cfg = load_config(*pool.engine_options.config_and_overrides())
    if family_of(cfg).prompts:
        return None
    return f"this fleet's model ({cfg.name}) reads no prompt; only --model liveavatar does"


def placement_device(engine_device: str) -> str:
    """Where workers go: GPU workers if asked for CUDA, or on `auto` when the cluster has
    GPUs; else CPU worker slots. FacecastError when the cluster has no such resource."""
    import ray

    resources = ray.cluster_resources()
    if engine_device == "auto":
        engine_device = "cuda" if resources.get("GPU", 0) > 0 else "cpu"
    if engine_device.startswith("cuda") and resources.get("GPU", 0) <= 0:
        raise FacecastError(
            "--device cuda: no node of the Ray cluster has a GPU (ray start --num-gpus N)"
        )
    if engine_device == "cpu" and resources.get(CPU_WORKER, 0) <= 0:
        raise FacecastError(
            f"no node of the Ray cluster offers the {CPU_WORKER} resource for CPU workers: "
            f"start nodes with ray start --resources '{{\"{CPU_WORKER}\": 1}}'"
        )
    return "cuda" if engine_device.startswith("cuda") else "cpu"


def make_pool(
    config: ServerConfig, engine_options: EngineOptions, options: FleetOptions
) -> WorkerPool:
    """The pool of a connected front (`connect` first)."""
    device = placement_device(engine_options.device)
    reference = Path(config.reference).read_bytes() if config.reference else None
    return WorkerPool(
        options, worker_config(config, options), engine_options, device, reference=reference
    )


def serve_fleet(config: ServerConfig, engine_options: EngineOptions, options: FleetOptions) -> int:
    """`facecast serve --cluster ray`: join (or start) the cluster, keep the workers, listen.
    Exit status 2 if the cluster cannot be used or every worker fails to start."""
    import torch

    local = None
    if options.address is None and not torch.cuda.is_available():  # a one-machine fleet
        local = {CPU_WORKER: options.workers}
    connect(options, local)
    pool = make_pool(config, engine_options, options)
    app = build_front_app(config, pool)
    url = f"http://{config.host}:{config.port}/"
    failed = False

    async def start(app: web.Application) -> None:
        await pool.start()
        print(
            f"facecast serve: {url} (front of {options.workers} {pool.device} workers, "
            f"{options.sessions_per_worker} sessions each)",
            flush=True,
        )

        async def report() -> None:
            nonlocal failed
            await pool.wait_for(_settled, timeout=float("inf"))
            if not any(v.state == "ok" for v in pool.workers.values()):
                failed = True
                reasons = "; ".join(v.reason or v.state for v in pool.workers.values())
                print(f"facecast serve: error: no worker started: {reasons}", file=sys.stderr)
                signal.raise_signal(signal.SIGTERM)
                return
            cap = pool.capacity()
            print(
                f"facecast serve: ready at {url}: {cap['workers']} workers, "
                f"{cap['slots']} session slots",
                flush=True,
            )

        app[REPORT] = asyncio.get_running_loop().create_task(report())

    async def stop(app: web.Application) -> None:
        app[REPORT].cancel()
        await pool.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    run_app(app, host=config.host, port=config.port, print=None)
    return 2 if failed else 0


def _settled(pool: WorkerPool) -> bool:
    """Start-up is over: a worker is ready, or none is pending or starting any more."""
    views = pool.workers.values()
    return any(v.state == "ok" for v in views) or not any(
        v.state in ("pending", "starting") for v in views
    )
