"""WHIP and WHEP through a fleet front: the signalling relayed to the session's worker.

    POST   /whip                  placed as POST /offer is (the worker with the most free
                                  slots) → 201, the worker's answer, `Location: /whip/{id}`
    DELETE /whip/{id}             ended on its worker
    PATCH  /whip/{id}             trickled candidates added on its worker → 204
    POST   /whep/{id}             a viewer on the session's worker → 201, its answer,
                                  `Location: /whep/{id}/{viewer}`
    DELETE /whep/{id}/{viewer}    that viewer ended on its worker
    PATCH  /whep/{id}/{viewer}    trickle ICE of that viewer → 204
    HEAD, GET /whep/{id}[/{vid}], OPTIONS /whep/{id}: discovery, as the server answers it

The answers, errors and headers are the server's (`realtime.whip`, `realtime.whep`): the
worker runs the very code of those routes, on the SDP the front read; what the front can
refuse by itself (the content type, an offer that is not SDP or sends no audio, an ICE
restart) it refuses before asking a worker. The `Location` is the front's, so a client's
later DELETE and PATCH come back here and are routed by the registry, from any front.
The media, as for /offer, flows between the client and the worker's node.
"""

from __future__ import annotations

from aiohttp import web

from realtime.fleet.answers import answer_of
from realtime.fleet.metrics import METRICS
from realtime.fleet.pool import POOL, WorkerView
from realtime.security import read_body
from realtime.service import CONFIG
from realtime.whep import OPTIONS_HEADERS, check_viewer_offer
from realtime.whip import (
    SDP_TYPE,
    check_sdp_type,
    check_trickle_request,
    check_whip_offer,
    created,
)


def add_relay_routes(app: web.Application) -> None:
    app.router.add_post("/whip", _whip_post)
    app.router.add_delete("/whip/{id}", _whip_delete)
    app.router.add_patch("/whip/{id}", _whip_patch)
    app.router.add_post("/whep/{id}", _whep_post)
    app.router.add_get("/whep/{id}", _whep_discover)  # and HEAD
    app.router.add_options("/whep/{id}", _whep_options)
    app.router.add_get("/whep/{id}/{viewer}", _whep_discover)
    app.router.add_delete("/whep/{id}/{viewer}", _whep_delete)
    app.router.add_patch("/whep/{id}/{viewer}", _whep_patch)


async def place(app: web.Application, method: str, *args: object) -> dict:
    """An offer placed on a worker by its `method`, counted in the fleet's metrics."""
    metrics = app[METRICS]
    try:
        answer = await app[POOL].place(method, *args)
    except Exception as exc:
        if getattr(exc, "status", None) == 503:
            metrics.rejected.inc()
        raise
    metrics.placed.labels(answer["worker"]).inc()
    return answer


async def _sdp_body(request: web.Request) -> bytes:
    return await read_body(request, request.app[CONFIG].security.body_timeout_s)


async def _worker_of(request: web.Request) -> WorkerView:
    """The worker of the URL's session (404 if the session is not live, 503 if its
    worker is gone)."""
    _, view = await request.app[POOL].session_worker(request.match_info["id"])
    return view


async def _call(request: web.Request, view: WorkerView, method: str, *args: object) -> dict:
    """`method` on `view`'s worker within the call timeout; its error raised as the
    server's. Offers get the offer timeout: the worker negotiates them (ICE gathering)."""
    pool = request.app[POOL]
    timeout = pool.options.offer_timeout_s if method.endswith("_offer") else None
    return answer_of(await pool.on_worker(view, method, *args, timeout=timeout))


# ---- WHIP ----------------------------------------------------------------------------


async def _whip_post(request: web.Request) -> web.Response:
    check_sdp_type(request, "a WHIP offer")
    sdp = check_whip_offer(await _sdp_body(request))  # 400 before any worker is asked
    answer = await place(request.app, "whip_offer", sdp)
    ice_servers = request.app[CONFIG].ice_servers
    return created(answer["sdp"], f"/whip/{answer['session_id']}", ice_servers)


async def _whip_delete(request: web.Request) -> web.Response:
    view = await _worker_of(request)
    answer = await _call(request, view, "whip_close", request.match_info["id"])
    request.app[POOL].session_ended(view, request.match_info["id"])
    return web.json_response(answer)


async def _whip_patch(request: web.Request) -> web.Response:
    view = await _worker_of(request)  # 404 first, as the server answers
    check_trickle_request(request)
    fragment = (await _sdp_body(request)).decode("utf-8", "replace")
    await _call(request, view, "whip_trickle", request.match_info["id"], fragment)
    return web.Response(status=204)


# ---- WHEP ----------------------------------------------------------------------------


async def _whep_post(request: web.Request) -> web.Response:
    check_sdp_type(request, "a WHEP offer")
    view = await _worker_of(request)  # 404 before reading the body
    sdp, _ = check_viewer_offer(await _sdp_body(request))
    answer = await _call(request, view, "whep_offer", request.match_info["id"], sdp)
    return created(answer["sdp"], answer["location"], request.app[CONFIG].ice_servers)


async def _whep_delete(request: web.Request) -> web.Response:
    view = await _worker_of(request)
    sid, vid = request.match_info["id"], request.match_info["viewer"]
    return web.json_response(await _call(request, view, "whep_close", sid, vid))


async def _whep_patch(request: web.Request) -> web.Response:
    view = await _worker_of(request)
    check_trickle_request(request)
    fragment = (await _sdp_body(request)).decode("utf-8", "replace")
    sid, vid = request.match_info["id"], request.match_info["viewer"]
    await _call(request, view, "whep_trickle", sid, vid, fragment)
    return web.Response(status=204)


async def _whep_discover(request: web.Request) -> web.Response:
    view = await _worker_of(request)
    sid, vid = request.match_info["id"], request.match_info.get("viewer")
    await _call(request, view, "whep_check", sid, vid)
    return web.Response(status=200, headers={"Content-Type": SDP_TYPE})


async def _whep_options(request: web.Request) -> web.Response:
    view = await _worker_of(request)
    await _call(request, view, "whep_check", request.match_info["id"], None)
    return web.Response(status=200, headers=OPTIONS_HEADERS)
