"""All the viewers of one session: a sink of the session that feeds one shared encoder
per codec and one Opus encode, and hands their packets to every viewer."""

from __future__ import annotations

import asyncio
import fractions
import secrets

import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.codecs.opus import OpusEncoder
from aiortc.sdp import SessionDescription

from pipeline.clock import OUTPUT_RATE
from realtime.errors import BadRequest, SessionNotFound
from realtime.offer import check_answer, reason_of
from realtime.session import PeerSession
from realtime.whep.encoder import VIDEO_CODECS, SharedVideoEncoder
from realtime.whep.metrics import WhepMetrics
from realtime.whep.tracks import ViewerAudioTrack, ViewerVideoTrack
from realtime.whep.viewer import Viewer


class WhepFanout:
    """All the viewers of one session; a sink of the session (put_video/put_audio are
    called on the event loop by its tracks, exactly as they send)."""

    def __init__(
        self, session: PeerSession, metrics: WhepMetrics, registry: dict[str, WhepFanout]
    ) -> None:
        self.session_id = session.id
        self.video_size = session.video_size
        self.metrics = metrics
        self.viewers: dict[str, Viewer] = {}
        self.reserved = 0  # offers being negotiated
        self.encoders: dict[str, SharedVideoEncoder] = {}  # by codec mime type
        self.closed = False
        self._opus: OpusEncoder | None = None
        self._registry = registry
        self._closing: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        session.sinks.append(self)  # Session.close() closes its sinks: and so its viewers
        # Its video track ends first, before the engine thread has stopped: start then.
        session.video.on("ended", self.close)

    # ---- MediaSink -------------------------------------------------------------------

    def put_video(self, frame_rgb: np.ndarray, index: int) -> None:
        for encoder in self.encoders.values():
            encoder.put(frame_rgb, index)

    def put_audio(self, pcm_s16_48k: np.ndarray, sample_index: int) -> None:
        tracks = [v.audio for v in self.viewers.values() if v.audio is not None and v.audio.started]
        if not tracks:
            self._opus = None  # a new listener starts a fresh stream
            return
        if self._opus is None:
            self._opus = OpusEncoder()
        frame = av.AudioFrame.from_ndarray(pcm_s16_48k.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        frame.pts = sample_index
        frame.time_base = fractions.Fraction(1, OUTPUT_RATE)
        payloads, _ = self._opus.encode(frame)  # 20 ms in, one packet out: ~0.05 ms
        for payload in payloads:
            packet = av.Packet(payload)
            packet.pts = sample_index  # the session's own audio timeline, as its peer's
            packet.time_base = fractions.Fraction(1, OUTPUT_RATE)
            for track in tracks:
                track.push(packet)

    # ---- viewers ---------------------------------------------------------------------

    async def add_viewer(self, sdp: str, kinds: list[str]) -> Viewer:
        self.reserved += 1
        try:
            viewer = await self._negotiate(sdp, kinds)
        finally:
            self.reserved -= 1
        if self.closed:  # the session ended meanwhile
            await viewer.close("the session ended")
            raise SessionNotFound(f"session {self.session_id!r} ended")
        self.viewers[viewer.id] = viewer
        if viewer.codec is not None:
            encoder = self.encoders.get(viewer.codec)
            if encoder is None:
                encoder = self.encoders[viewer.codec] = SharedVideoEncoder(
                    viewer.codec, self.video_size, self.session_id, self.metrics
                )
            encoder.attach(viewer)
        viewer.watch()
        self.metrics.viewers_total.inc()
        self._count()
        return viewer

    async def _negotiate(self, sdp: str, kinds: list[str]) -> Viewer:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # as the session's: no STUN
        viewer = Viewer(self, secrets.token_urlsafe(18), pc)
        try:
            # Made before the offer is set, so that its sections take them.
            if "audio" in kinds:
                viewer.audio = ViewerAudioTrack()
                transceiver = pc.addTransceiver(viewer.audio, direction="sendonly")
                opus = [
                    c
                    for c in RTCRtpSender.getCapabilities("audio").codecs
                    if c.mimeType.lower() == "audio/opus"
                ]
                transceiver.setCodecPreferences(opus)  # the shared packets are Opus
            if "video" in kinds:
                viewer.video = ViewerVideoTrack(viewer)
                transceiver = pc.addTransceiver(viewer.video, direction="sendonly")
                # A PLI or FIR from this viewer asks the shared encoder for a keyframe
                # (aiortc's sender would only flag its own encoder, which packs here).
                transceiver.sender._send_keyframe = viewer.request_keyframe  # type: ignore[method-assign]
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            check_answer(pc.localDescription.sdp)
            viewer.codec = answered_video_codec(pc.localDescription.sdp)
        except BadRequest:
            await viewer.close("offer refused")
            raise
        except Exception as exc:  # aiortc raises ValueError and friends on unusable offers
            await viewer.close("offer refused")
            raise BadRequest(f"cannot negotiate the offer: {reason_of(exc)}") from exc
        return viewer

    def forget(self, viewer: Viewer) -> None:
        if self.viewers.pop(viewer.id, None) is None:
            return
        if viewer.codec is not None:
            encoder = self.encoders.get(viewer.codec)
            if encoder is not None:
                encoder.detach(viewer)
                if not encoder.viewers:
                    del self.encoders[viewer.codec]
                    encoder.close()
        self._count()

    def _count(self) -> None:
        if not self.closed:
            self.metrics.viewers.labels(self.session_id).set(len(self.viewers))

    def close(self) -> asyncio.Task:
        """Close every viewer (the session ended); idempotent."""
        if self._closing is None:
            self.closed = True
            self._closing = self._loop.create_task(self._close())
        return self._closing

    async def _close(self) -> None:
        await asyncio.gather(
            *(v.close("the session ended") for v in list(self.viewers.values())),
            return_exceptions=True,
        )
        for encoder in self.encoders.values():
            encoder.close()
        self.encoders.clear()
        try:
            self.metrics.viewers.remove(self.session_id)
        except KeyError:
            pass
        if self._registry.get(self.session_id) is self:
            del self._registry[self.session_id]


def answered_video_codec(answer: str) -> str | None:
    """The mime type the video sender sends (the answer's first video codec), if any."""
    for media in SessionDescription.parse(answer).media:
        if media.kind == "video" and media.port != 0:
            for codec in media.rtp.codecs:
                mime = f"video/{codec.name}".lower()
                if mime in VIDEO_CODECS:
                    return mime
    return None
