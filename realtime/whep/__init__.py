"""WHEP egress (draft-ietf-wish-whep): any number of viewers watch a live avatar session.

    POST    /whep/{session_id}        body: an SDP offer that receives (audio and/or video,
                                      `recvonly` or `sendrecv`), `Content-Type: application/sdp`
                                      → 201 Created, the answer (`sendonly`),
                                        `Location: /whep/{session_id}/{viewer_id}`, one
                                        `Link: <…>; rel="ice-server"` per configured server
    DELETE  /whep/{sid}/{viewer_id}   ends that viewer only → 200; the session goes on
    PATCH   /whep/{sid}/{viewer_id}   trickle ICE, as WHIP does it → 204; ICE restart → 422
    HEAD, GET /whep/{sid}[/{vid}]     200, `Content-Type: application/sdp`, no body (the
                                      draft's discoverability; GET has no representation)
    OPTIONS /whep/{sid}               200, `Accept-Post: application/sdp`

A viewer watches what the session's own peer gets: the same frames and audio, on the same
playout clock, from the moment it connects. Watching costs no engine time and no session
slot; a viewer leaving changes nothing for the session or the other viewers, and a
session that ends closes its viewers (their peer connections close: DTLS close_notify,
RTCP BYE).

**One generation, one encode, many viewers.** The viewers of a session hang on one
`WhepFanout`, a `MediaSink` of the session (`realtime.tracks`), so it receives every frame
and every 20 ms of audio exactly when the session sends them to its own peer; generation
runs once whatever the number of viewers. aiortc encodes per `RTCRtpSender`, and a relay of
decoded frames (aiortc's `MediaRelay`) would still run one VP8 encoder per viewer: 1.8 ms a
frame at 256x256 but 12 ms at 720p, a third of a core per viewer at 25 fps. So each
(session, codec) pair has one `SharedVideoEncoder` (libvpx or libx264 through PyAV, in its
own thread), and each 20 ms of audio is Opus-encoded once; every viewer's track hands the
same `av.Packet`s to its sender, which only packetizes, encrypts and sends them (aiortc's
`RTCRtpSender` takes pre-encoded packets). Every viewer of a codec therefore decodes the
very same pictures. The costs of sharing: one bitrate for all the viewers of a codec
(`video_bitrate`; no per-viewer REMB adaptation), and keyframes are shared: a viewer that
joins gets one at the next frame; one that reports loss (PLI/FIR, which the fan-out takes
from each sender) or fell behind gets one at most every `KEYFRAME_MIN_INTERVAL_S`; and there
is one every `GOP_FRAMES` whatever happens.

**Nobody waits for a slow viewer.** Everything on the media path only appends to bounded
queues: the encoder's input (`ENCODER_BACKLOG` frames; beyond that the oldest frame is
skipped for everyone of that codec, counted) and each viewer's packets (`VIEWER_BACKLOG`);
a viewer whose sender falls that far behind has its queue emptied and resumes at the next
keyframe (counted), and its audio drops the oldest 20 ms. The session's tracks never block.

One module per part: `routes` (the HTTP surface above), `fanout` (a session's viewers),
`viewer` (one player), `encoder` (the shared encoder), `tracks` (a viewer's outgoing packet
tracks) and `metrics`, each importing only those after it; what a part asks of the one
that holds it is a small Protocol beside it (`ViewerHost`, `Subscriber`, `TrackOwner`).

Errors are JSON 4xx with a reason: 415 (not `application/sdp`), 400 (not SDP, no section
that receives, a `sendonly`/`inactive` section, two of a kind, no common codec, no ICE
credentials or fingerprint), 401 (token), 404 (no such live session or viewer), 503 (the
session has `max_viewers`).
"""

from realtime.whep.encoder import SharedVideoEncoder
from realtime.whep.fanout import WhepFanout
from realtime.whep.metrics import WhepMetrics
from realtime.whep.routes import (
    OPTIONS_HEADERS,
    WHEP_FANOUTS,
    add_whep_routes,
    add_whep_viewer,
    check_viewer_offer,
    check_whep_resource,
    close_whep_viewer,
    find_viewer,
)
from realtime.whep.tracks import VIEWER_BACKLOG, ViewerVideoTrack
from realtime.whep.viewer import Viewer

__all__ = [
    "OPTIONS_HEADERS",
    "VIEWER_BACKLOG",
    "WHEP_FANOUTS",
    "SharedVideoEncoder",
    "Viewer",
    "ViewerVideoTrack",
    "WhepFanout",
    "WhepMetrics",
    "add_whep_routes",
    "add_whep_viewer",
    "check_viewer_offer",
    "check_whep_resource",
    "close_whep_viewer",
    "find_viewer",
]
