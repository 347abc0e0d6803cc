"""WHIP ingest (RFC 9725): any WHIP client's microphone becomes an avatar session.

    POST   /whip        body: an SDP offer, `Content-Type: application/sdp`
                        → 201 Created, the SDP answer (application/sdp),
                          `Location: /whip/{session_id}`, one `Link: <…>; rel="ice-server"`
                          per configured ICE server (none when none is configured)
    DELETE /whip/{id}   ends the session and frees its slot → 200
    PATCH  /whip/{id}   trickle ICE: the client's later candidates, as an RFC 8840
                        `application/trickle-ice-sdpfrag` → 204; an ICE restart → 422

The offer's audio is the avatar's microphone, exactly like the browser's track on
`POST /offer`. Where the offer also receives (audio `sendrecv`, a video section), the
answer sends the avatar's video and audio back. A WHIP client that only sends (the usual
case: OBS, GStreamer's whip-client) gets nothing back, and the session still runs: the
avatar tracks nobody sends are pulled here at their pace, so frames are generated and
counted, playback events fire and mirrors (KVS) see the stream as with any other peer.

The answer always carries every server candidate (aiortc gathers before answering), so a
client may send its offer before gathering and trickle its own candidates with PATCH.

Auth is the server's `Authorization: Bearer` middleware; errors are JSON 4xx with a reason
(415 wrong content type, 400 unusable offer, 401 token, 404 unknown session, 503 full or
the engine still starting).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiohttp import web
from aiortc import RTCIceCandidate, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.sdp import SessionDescription, candidate_from_sdp

from realtime.errors import BadRequest, SessionNotFound, Unprocessable, UnsupportedMediaType
from realtime.ice_servers import link_header
from realtime.negotiation import open_session
from realtime.offer import OfferRequest
from realtime.service import SERVICE, require_engine
from realtime.session import PeerSession

SDP_TYPE = "application/sdp"
TRICKLE_TYPE = "application/trickle-ice-sdpfrag"
SENDING = ("sendrecv", "sendonly")
log = logging.getLogger(__name__)

# Live WHIP sessions by id, each with the tasks that pull its unsent tracks (their owner).
WHIP_SESSIONS = web.AppKey("facecast-whip", dict[str, list[asyncio.Task]])


def add_whip_routes(app: web.Application) -> None:
    app[WHIP_SESSIONS] = {}
    app.router.add_post("/whip", _post)
    app.router.add_delete("/whip/{id}", _delete)
    app.router.add_patch("/whip/{id}", _patch)


async def _post(request: web.Request) -> web.Response:
    check_sdp_type(request, "a WHIP offer")
    session = await open_whip_session(request.app, await request.read())
    service = request.app[SERVICE]
    return created(
        session.pc.localDescription.sdp, f"/whip/{session.id}", service.config.ice_servers
    )


def check_sdp_type(request: web.Request, what: str) -> None:
    """415 unless the body is labelled `application/sdp` (WHIP and WHEP offers)."""
    if request.content_type != SDP_TYPE:
        raise UnsupportedMediaType(
            f"{what} is sent as 'Content-Type: {SDP_TYPE}' (got {request.content_type or 'none'!r})"
        )


async def open_whip_session(app: web.Application, body: bytes) -> PeerSession:
    """A live session for a WHIP offer (POST /whip here, or a fleet worker's relay)."""
    service = app[SERVICE]
    require_engine(service)
    sdp = check_whip_offer(body)
    session = await open_session(
        service, OfferRequest(RTCSessionDescription(sdp=sdp, type="offer")), require_video=False
    )
    sessions = app[WHIP_SESSIONS]
    sessions[session.id] = _pull_unsent_tracks(session)
    # PeerSession.close() stops its tracks: the end of any session, whoever closes it.
    session.video.on("ended", lambda: _forget(sessions, session.id))
    log.info("session %s: opened by WHIP", session.id)
    return session


def created(answer: str, location: str, ice_servers: list[RTCIceServer]) -> web.Response:
    """The 201 of a WHIP (or WHEP) POST: the answer, its resource, the ICE servers."""
    response = web.Response(
        status=201,
        body=answer.encode(),  # bytes: no "; charset" appended
        content_type=SDP_TYPE,
        headers={"Location": location},
    )
    for server in ice_servers:
        for value in link_header(server):
            response.headers.add("Link", value)
    return response


async def _delete(request: web.Request) -> web.Response:
    return web.json_response(await close_whip_session(request.app, request.match_info["id"]))


async def close_whip_session(app: web.Application, sid: str) -> dict:
    session = whip_session(app, sid)
    await session.close("ended by the WHIP client")
    return {"closed": session.id}


async def _patch(request: web.Request) -> web.Response:
    """Trickle ICE (RFC 9725 §4.3.1): add the fragment's candidates → 204 No Content."""
    return await trickle(request, whip_session(request.app, request.match_info["id"]).pc)


async def trickle(request: web.Request, pc: RTCPeerConnection) -> web.Response:
    """A PATCH of a WHIP or WHEP resource: trickled candidates (RFC 8840) are added to
    `pc` → 204; an ICE restart (If-Match: *, or a new ice-ufrag) → 422."""
    check_trickle_request(request)
    await add_fragment(pc, (await request.read()).decode("utf-8", "replace"))
    return web.Response(status=204)


def check_trickle_request(request: web.Request) -> None:
    """What a PATCH's headers alone refuse: an ICE restart (RFC 9725 marks one with
    `If-Match: *`) → 422, a body that is not an SDP fragment → 415."""
    if request.headers.get("If-Match") == "*":
        raise Unprocessable("ICE restart is not supported: DELETE the session, POST a new offer")
    if request.content_type != TRICKLE_TYPE:
        raise UnsupportedMediaType(
            f"trickle candidates are sent as 'Content-Type: {TRICKLE_TYPE}' "
            f"(got {request.content_type or 'none'!r})"
        )


async def add_fragment(pc: RTCPeerConnection, text: str) -> None:
    """Add an RFC 8840 fragment's candidates to `pc`; 422 if it restarts ICE."""
    remote = SessionDescription.parse(pc.remoteDescription.sdp).media[0]
    fragment = parse_sdpfrag(text, remote.rtp.muxId)
    offered_ufrag = remote.ice.usernameFragment if remote.ice else None
    if fragment.ufrag is not None and fragment.ufrag != offered_ufrag:
        raise Unprocessable(
            f"ice-ufrag {fragment.ufrag!r} is not the offer's: an ICE restart, which is not "
            "supported (DELETE the session, POST a new offer)"
        )
    for candidate in fragment.candidates:
        await pc.addIceCandidate(candidate)
    if fragment.end:
        await pc.addIceCandidate(None)


def whip_session(app: web.Application, sid: str) -> PeerSession:
    session = app[SERVICE].sessions.get(sid)
    if sid not in app[WHIP_SESSIONS] or session is None:
        raise SessionNotFound(f"no live WHIP session {sid!r}")
    return session


@dataclass
class IceFragment:
    ufrag: str | None
    candidates: list[RTCIceCandidate]
    end: bool  # a=end-of-candidates: the client has sent them all


def parse_sdpfrag(text: str, default_mid: str | None) -> IceFragment:
    """An RFC 8840 SDP fragment: its ice-ufrag, candidates (with their m-section's mid)."""
    fragment = IceFragment(None, [], False)
    mid = default_mid
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "a=ice-ufrag":
            fragment.ufrag = value
        elif key == "a=mid":
            mid = value
        elif key == "a=end-of-candidates":
            fragment.end = True
        elif key == "a=candidate":
            try:
                candidate = candidate_from_sdp(value)
            except Exception as exc:  # aiortc asserts on a short line, int() on bad fields
                raise BadRequest(f"bad candidate line {line.strip()!r}: {exc!r}") from exc
            candidate.sdpMid = mid
            fragment.candidates.append(candidate)
    return fragment


def parse_offer(body: bytes) -> tuple[str, SessionDescription]:
    """The offer's SDP text and its parse; 400 if it is not SDP."""
    sdp = body.decode("utf-8", errors="replace")
    if not sdp.startswith("v=0"):
        raise BadRequest("the body is not an SDP offer (it must start with 'v=0')")
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises ValueError, KeyError, …
        raise BadRequest(f"the offer's SDP does not parse: {exc or type(exc).__name__}") from exc
    return sdp, desc


def check_whip_offer(body: bytes) -> str:
    """The offer's SDP text, if it parses and sends audio (the avatar's microphone)."""
    sdp, desc = parse_offer(body)
    audio = [m for m in desc.media if m.kind == "audio"]
    if not any((m.direction or "sendrecv") in SENDING for m in audio):
        raise BadRequest(
            "the offer sends no audio: WHIP ingests the avatar's microphone, so offer an "
            "audio section that is sendonly or sendrecv"
        )
    return sdp


def _pull_unsent_tracks(session: PeerSession) -> list[asyncio.Task]:
    """Pull each avatar track that no RTP sender pulls, at the pace a sender would."""
    sent = {t.sender.track for t in session.pc.getTransceivers() if t.currentDirection in SENDING}
    loop = asyncio.get_running_loop()
    return [
        loop.create_task(_pull(session.id, track), name=f"whip-pull-{track.kind}-{session.id[:8]}")
        for track in (session.video, session.audio)
        if track not in sent
    ]


async def _pull(sid: str, track: MediaStreamTrack) -> None:
    try:
        while True:
            await track.recv()  # paced by the track itself: one frame per deadline
    except MediaStreamError:  # the session stopped the track
        return
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("session %s: pulling the unsent %s track failed", sid, track.kind)


def _forget(sessions: dict[str, list[asyncio.Task]], sid: str) -> None:
    # A track stopped before the clock started would wait forever: cancel, don't wait.
    for task in sessions.pop(sid, []):
        task.cancel()
