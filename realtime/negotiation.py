"""Opening a session from a checked offer: a slot, a peer connection, the answer.

`open_session` serves POST /offer, POST /whip and a fleet worker; it turns an
`OfferRequest` into a started `PeerSession` registered with the `Service`, or refuses with
a reason (`ServerFull`, `BadRequest`) and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from aiortc import RTCConfiguration, RTCPeerConnection

from realtime.engine_timing import EngineTiming
from realtime.errors import BadRequest, ServerFull
from realtime.offer import OfferRequest, check_answer, check_codecs, reason_of
from realtime.service import Service
from realtime.session import PeerSession
from realtime.session_config import SessionConfig
from realtime.vad import VoiceActivityDetector

log = logging.getLogger(__name__)


async def open_session(
    service: Service, request: OfferRequest, require_video: bool = True
) -> PeerSession:
    """A new live session for `request`, if a slot is free (POST /offer and POST /whip).

    `require_video=False` accepts an offer with no video section (a WHIP client that only
    sends its microphone): the avatar is generated all the same, just not sent to it."""
    limit = service.max_sessions
    if len(service.sessions) + service.reserved >= limit:
        service.metrics.sessions_rejected.inc()
        raise ServerFull(f"server full: {limit} sessions are live; try again later")
    service.reserved += 1
    try:
        return await _negotiate(service, request, require_video)
    finally:
        service.reserved -= 1


async def _negotiate(service: Service, request: OfferRequest, require_video: bool) -> PeerSession:
    offer = request.description
    engine = service.warm_engine()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=list(service.config.peer_ice_servers)))
    session_config = SessionConfig(**{**service.config.session.__dict__, "seed": request.seed})
    vad = await asyncio.to_thread(VoiceActivityDetector)  # loads its model: off the loop
    session = PeerSession(
        secrets.token_urlsafe(18),
        pc,
        lambda seed: service.open_engine_stream(seed, request.photo, request.prompt),
        service.video_size(),
        session_config,
        service.metrics,
        service.on_session_closed,
        vad,
        # every call already live or being negotiated (this one among them) shares the engine
        EngineTiming.of(
            engine,
            engine.own_process,
            sessions=service.sessions_to_plan_for(len(service.sessions) + service.reserved),
            sharing=len(service.sessions) + service.reserved,
        ),
        service.engine_lock_for_sessions,
        service.cycle,
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
