"""Free a closed call at once: break the reference cycles that would keep it for the collector.

CPython frees an object the moment its last reference goes, unless it sits in a reference
cycle; cycles wait for a garbage collection of their generation, and a busy server's
oldest generation is collected rarely (its threshold grows with the long-lived heap that
torch and the engine keep). A closed call kept in a cycle holds everything reachable from
it: its frames, engine state, VAD model, and PyAV codec contexts with their FFmpeg
threads. Measured by tests/test_realtime_churn.py with the collector off: 30 calls took
the process from 3 to 123 threads and 523 to 827 MB; with the cycles broken, 3 to 3
threads and 569 to 548 MB.

aiortc's own graph is cyclic while a peer connection lives: the connection subscribes
bound methods of itself to its ICE gatherer, ICE transports and DTLS transports
(`statechange`) and to its SCTP transport (`datachannel`). `RTCPeerConnection.close()`
removes only the listeners on the connection itself, so `release_peer_connection` removes
the rest once the connection is closed; no event can fire on a closed transport anyway.
`PeerSession._release` and `FacecastClient.close` break the cycles of our own objects.

A few small cycles are left to the collector, none holding media, codecs or threads: a
closed asyncio socket transport (its read callback is a bound method of itself), aioice's
check-list pairs and their STUN protocols, pyOpenSSL's verify-callback helper, and an
SCTP queue entry of a data channel that never opened.
"""

from __future__ import annotations

from aiortc import RTCPeerConnection


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
