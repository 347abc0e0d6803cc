"""The WHEP routes: POST, DELETE, PATCH, HEAD/GET and OPTIONS under /whep/{session_id}."""

from __future__ import annotations

import logging

from aiohttp import web

from realtime.errors import BadRequest, ServerFull, SessionNotFound
from realtime.offer import check_codecs, check_offer_transport
from realtime.security import read_body
from realtime.service import SERVICE
from realtime.session import PeerSession
from realtime.whep.fanout import WhepFanout
from realtime.whep.metrics import WhepMetrics
from realtime.whep.viewer import Viewer
from realtime.whip import SDP_TYPE, check_sdp_type, created, parse_offer, trickle

log = logging.getLogger(__name__)


RECEIVING = ("recvonly", "sendrecv")

# Each live session that has (or had) viewers → its fan-out.
WHEP_FANOUTS = web.AppKey("facecast-whep", dict[str, WhepFanout])
WHEP_METRICS = web.AppKey("facecast-whep-metrics", WhepMetrics)


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
