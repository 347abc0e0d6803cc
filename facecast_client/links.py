"""Where an agent framework's avatar runs, behind one interface: `open(on_video, on_audio,
on_event)` connects and returns the `UtteranceSender` its speech goes to; `close()` ends it.

    RemoteLink   a `facecast serve` elsewhere, through `FacecastClient` with no microphone;
                 the utterances go on its data channel
    LocalLink    a `realtime.session.PeerSession` of this process around a started engine,
                 its paced tracks read directly (no codec, no network), the same messages
                 handed to it

`on_video(rgb, pts)` and `on_audio(pcm, pts)` get each frame with its pts on its own clock
from 0; `on_event(msg)` each of the session's events.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from facecast_client.client import FacecastClient
from facecast_client.speech import UtteranceSender
from pipeline.stream import Reference

if TYPE_CHECKING:
    from realtime.session import PeerSession

Media = Callable[[np.ndarray, int], None]  # (frame, pts on its own clock from 0)


class RemoteLink:
    """A `facecast serve` over WebRTC: video and audio back, utterances on the channel."""

    def __init__(self, url: str, token: str | None, seed: int) -> None:
        self.url, self.token, self.seed = url, token, seed
        self.client: FacecastClient | None = None

    async def open(self, on_video: Media, on_audio: Media, on_event) -> UtteranceSender:
        bases: dict[str, int] = {}

        def relative(kind: str, pts: int) -> int:
            return pts - bases.setdefault(kind, pts)  # RTP clocks start anywhere

        self.client = FacecastClient(
            self.url,
            None,
            token=self.token,
            seed=self.seed,
            record=False,
            on_video=lambda rgb, pts, t: on_video(rgb, relative("video", pts)),
            on_audio=lambda pcm, pts, t: on_audio(pcm, relative("audio", pts)),
            on_event=on_event,
        )
        await self.client.connect()
        await self.client.wait_channel_open()
        return self.client.speech

    @property
    def session_id(self) -> str | None:
        return self.client.session_id if self.client else None

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


class LocalLink:
    """An in-process session around `engine` (a started `pipeline` engine)."""

    def __init__(self, engine: Any, reference: Reference | None, seed: int, config) -> None:
        self.engine, self.reference, self.seed, self.config = engine, reference, seed, config
        self.session: PeerSession | None = None
        self._pulls: list[asyncio.Task] = []

    async def open(self, on_video: Media, on_audio: Media, on_event) -> UtteranceSender:
        import json

        from aiortc import RTCPeerConnection

        from realtime.engine_timing import EngineTiming
        from realtime.metrics import RealtimeMetrics
        from realtime.reference import load_reference
        from realtime.session import PeerSession
        from realtime.session_config import SessionConfig
        from realtime.vad import VoiceActivityDetector

        video = self.engine.cfg.video
        size = (int(video.width), int(video.height))
        reference = self.reference
        if reference is None:
            reference = load_reference(None, self.engine.cfg)

        async def closed(session) -> None:
            pass

        session = PeerSession(
            secrets.token_urlsafe(18),
            RTCPeerConnection(),  # never negotiated: its tracks are read here
            lambda seed: self.engine.new_stream(reference, seed=seed),
            size,
            self.config or SessionConfig(seed=self.seed),
            RealtimeMetrics(),
            closed,
            await asyncio.to_thread(VoiceActivityDetector),
            EngineTiming.of(self.engine),
        )
        self.session = session
        session.listeners.append(lambda text: on_event(json.loads(text)))
        session.start()  # no microphone: it idles until the first utterance
        loop = asyncio.get_running_loop()
        self._pulls = [
            loop.create_task(self._pull(session.video, on_video, video=True)),
            loop.create_task(self._pull(session.audio, on_audio, video=False)),
        ]

        def send(data: str | bytes) -> None:
            session.handle_message(data, lambda text: on_event(json.loads(text)))

        return UtteranceSender(send)

    async def _pull(self, track, deliver: Media, video: bool) -> None:
        from aiortc.mediastreams import MediaStreamError

        try:
            while True:
                frame = await track.recv()  # paced by the track: one frame per deadline
                if video:
                    deliver(frame.to_ndarray(format="rgb24"), int(frame.pts))
                else:
                    deliver(frame.to_ndarray().reshape(-1), int(frame.pts))
        except MediaStreamError:
            return

    @property
    def session_id(self) -> str | None:
        return self.session.id if self.session else None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close("the pipeline ended")
        for task in self._pulls:
            task.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)
