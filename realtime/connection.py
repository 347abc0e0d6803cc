"""A session's peer connection, as a part: closed last of the media, then freed at once.

CPython frees an object the moment its last reference goes, unless it sits in a reference
cycle; cycles wait for a garbage collection of their generation, and a busy server's
oldest generation is collected rarely (its threshold grows with the long-lived heap that
torch and the engine keep). A closed call kept in a cycle holds everything reachable from
it: its frames, engine state, VAD model, and PyAV codec contexts with their FFmpeg
threads. Measured by tests/test_realtime_churn.py with the collector off: 30 calls took
the process from 3 to 123 threads and 523 to 827 MB; with the cycles broken, 3 to 3
threads and 569 to 548 MB. Each part of a session breaks its own cycles in its `close`;
this one breaks aiortc's.

aiortc's own graph is cyclic while a peer connection lives: the connection subscribes
bound methods of itself to its ICE gatherer, ICE transports and DTLS transports
(`statechange`) and to its SCTP transport (`datachannel`). `RTCPeerConnection.close()`
removes only the listeners on the connection itself, so `release_peer_connection` removes
the rest once the connection is closed; no event can fire on a closed transport anyway.
The client (`facecast_client.client`) and WHEP viewers (`realtime.whep`) free theirs the same
way.

A few small cycles are left to the collector, none holding media, codecs or threads: a
closed asyncio socket transport (its read callback is a bound method of itself), aioice's
check-list pairs and their STUN protocols, pyOpenSSL's verify-callback helper, and an
SCTP queue entry of a data channel that never opened.
"""

from __future__ import annotations

import logging

from aiortc import RTCPeerConnection

log = logging.getLogger(__name__)


class PeerLink:
    """The session's `RTCPeerConnection`: the one thing of aiortc it owns."""

    def __init__(self, session_id: str, pc: RTCPeerConnection) -> None:
        self._sid = session_id
        self.pc = pc

    def receives_audio(self) -> bool:
        """The peer sends a microphone (an agent may speak only through utterances)."""
        return any(
            t.kind == "audio" and t.currentDirection in ("sendrecv", "recvonly")
            for t in self.pc.getTransceivers()
        )

    def stop(self) -> None:
        pass  # the tracks it sends stop with their own part

    async def close(self) -> None:
        """Hang up, then drop every listener aiortc keeps inside the closed connection."""
        try:
            await self.pc.close()
        except Exception:
            log.exception("session %s: peer connection close failed", self._sid)
        finally:
            if self.pc.connectionState == "closed":
                release_peer_connection(self.pc)


def release_peer_connection(pc: RTCPeerConnection) -> None:
    """Drop every event listener inside a *closed* peer connection (see the module doc)."""
    assert pc.connectionState == "closed", "release only a closed peer connection"
    emitters: list = [pc]
    for transceiver in pc.getTransceivers():
        for dtls in (transceiver.receiver.transport, transceiver.sender.transport):
            if dtls is not None:
                emitters += [dtls, dtls.transport, dtls.transport.iceGatherer]
    if pc.sctp is not None:
        dtls = pc.sctp.transport
        emitters += [pc.sctp, dtls, dtls.transport, dtls.transport.iceGatherer]
    for emitter in emitters:
        emitter.remove_all_listeners()
