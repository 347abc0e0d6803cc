"""A WHEP player made of aiohttp and aiortc only, as any player does it: a recvonly offer
POSTed as application/sdp, the 201's answer and Location, optionally its candidates
trickled with PATCH; what it receives is recorded for the test to check.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin

import aiohttp
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from realtime.whip import TRICKLE_TYPE

SDP = {"Content-Type": "application/sdp"}


@dataclass
class Watcher:
    """One WHEP player and what it received: video (pts, arrival, digest of the decoded
    picture) and audio (pts, arrival), pts relative to its first packet (aiortc)."""

    pc: RTCPeerConnection
    posted: float = 0.0
    status: int = 0
    headers: dict = field(default_factory=dict)
    body: str = ""
    location: str | None = None
    video: list[tuple[int, float, str]] = field(default_factory=list)
    audio: list[tuple[int, float]] = field(default_factory=list)
    ended: set[str] = field(default_factory=set)  # kinds whose track ended
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def viewer_id(self) -> str:
        return self.location.rsplit("/", 1)[1]

    async def close(self) -> None:
        await self.pc.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def whep_watch(
    http: aiohttp.ClientSession,
    endpoint: str,
    headers: dict,
    codec: str | None = None,
    trickle: bool = False,
) -> Watcher:
    """A WHEP player: recvonly audio and video (only `codec` if given), every candidate in
    the offer, or (`trickle`) none in it and all of them PATCHed after the 201."""
    w = Watcher(RTCPeerConnection())
    w.pc.addTransceiver("audio", direction="recvonly")
    video = w.pc.addTransceiver("video", direction="recvonly")
    if codec is not None:
        caps = RTCRtpReceiver.getCapabilities("video").codecs
        video.setCodecPreferences([c for c in caps if c.mimeType.lower() in (codec, "video/rtx")])

    async def consume(track) -> None:
        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                if track.kind == "video":
                    digest = hashlib.blake2b(frame.to_ndarray().tobytes(), digest_size=8)
                    w.video.append((int(frame.pts), now, digest.hexdigest()))
                else:
                    w.audio.append((int(frame.pts), now))
        except MediaStreamError:
            w.ended.add(track.kind)

    w.pc.on("track", lambda track: w.tasks.append(asyncio.ensure_future(consume(track))))
    await w.pc.setLocalDescription(await w.pc.createOffer())
    offer = w.pc.localDescription.sdp
    candidates = re.findall(r"a=candidate:[^\r\n]+", offer)
    if trickle:
        offer = re.sub(r"a=(candidate:[^\r\n]+|end-of-candidates)\r\n", "", offer)
    w.posted = time.monotonic()
    async with http.post(endpoint, data=offer, headers={**SDP, **headers}) as r:
        w.status, w.body = r.status, await r.text()
        w.headers = dict(r.headers)
        w.headers["Link"] = r.headers.getall("Link", [])
    if w.status != 201:
        await w.pc.close()
        return w
    w.location = urljoin(endpoint, w.headers["Location"])
    if trickle:  # RFC 8840 fragment: the offer's ICE credentials and its first section
        ufrag = re.search(r"a=ice-ufrag:(\S+)", offer)[1]
        mid = re.search(r"a=mid:(\S+)", offer)[1]
        frag = f"a=ice-ufrag:{ufrag}\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:{mid}\r\n"
        frag += "".join(f"{c}\r\n" for c in candidates) + "a=end-of-candidates\r\n"
        async with http.patch(
            w.location, data=frag, headers={"Content-Type": TRICKLE_TYPE, **headers}
        ) as r:
            assert r.status == 204, await r.text()
    await w.pc.setRemoteDescription(RTCSessionDescription(sdp=w.body, type="answer"))
    return w
