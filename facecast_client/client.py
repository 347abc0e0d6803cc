"""One call to a Facecast server over WebRTC (aiortc): stream speech in, get the avatar out.

    source = PcmSource.from_wav("hello.wav", speed=1.0)   # or PcmSource(); source.push(pcm)
    async with FacecastClient("http://127.0.0.1:8080", source, record_to="out.mp4") as c:
        await c.wait_frames(250)
        played_ms = await c.interrupt()
        print(call_stats(c))                                # facecast_client.call

An agent that pushes its TTS as utterances (`realtime.utterance`) connects without a
microphone and speaks through the data channel (or `SpeechSocket`, the WebSocket):

    async with FacecastClient(url, source=None) as c:
        await c.speech.say(pcm24k, 24_000)                   # one utterance, as fast as it goes
        finished = await c.wait_event("playback_finished")   # {id, playback_position, …}
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from facecast_client.media import CallRecorder, PcmSource, Received
from facecast_client.speech import UtteranceSender, wait_for_event
from pipeline.clock import OUTPUT_RATE
from realtime.connection import release_peer_connection

log = logging.getLogger(__name__)


class FacecastClient:
    """One call to a Facecast server. `source` is the microphone; None sends none (an
    agent speaking through `speech`, the utterance channel). `on_video(rgb, pts, t)` and
    `on_audio(pcm, pts, t)` see each received frame and `on_event(msg)` each event;
    `record=False` keeps none of the frames (nor `stats` events)."""

    def __init__(
        self,
        url: str,
        source: PcmSource | None,
        token: str | None = None,
        seed: int = 0,
        record_to: str | Path | None = None,
        keep_frames: bool = False,
        offer_options: dict | None = None,
        on_video: Callable[[np.ndarray, int, float], None] | None = None,
        on_audio: Callable[[np.ndarray, int, float], None] | None = None,
        on_event: Callable[[dict], None] | None = None,
        record: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.source = source
        self.token = token
        self.seed = seed
        self.keep_frames = keep_frames
        self.offer_options = dict(offer_options or {})  # e.g. {"kvs_stream": "lobby"}
        self.received = Received()
        self.events: list[dict] = []  # data-channel messages, each with "_t" (monotonic)
        self.session_id: str | None = None
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._channel = self.pc.createDataChannel("facecast")
        self._tasks: list[asyncio.Task] = []
        self._writer = CallRecorder(record_to) if record_to else None
        self._new_frame = asyncio.Condition()
        self._new_event = asyncio.Condition()
        self._notifiers: set[asyncio.Task] = set()  # held until done (the loop keeps weak refs)
        self._interrupts: asyncio.Queue[int] = asyncio.Queue(maxsize=16)
        self._on_video, self._on_audio, self._record = on_video, on_audio, record
        self._on_event = on_event
        self.speech = UtteranceSender(self._channel_send)

    def _channel_send(self, data: str | bytes) -> None:
        if self._channel.readyState != "open":
            raise ConnectionError("data channel is not open")
        self._channel.send(data)

    async def wait_channel_open(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self._channel.readyState != "open":
            if time.monotonic() > deadline:
                raise TimeoutError("the data channel did not open")
            await asyncio.sleep(0.02)

    async def __aenter__(self) -> FacecastClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def connect(self) -> None:
        if self.source is not None:
            self.pc.addTrack(self.source)
        else:  # no microphone: the avatar's audio only comes back
            self.pc.addTransceiver("audio", direction="recvonly")
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.on("track", self._on_track)
        self._channel.on("message", self._on_message)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = {
            **self.offer_options,
            "sdp": self.pc.localDescription.sdp,
            "type": "offer",
            "seed": self.seed,
        }
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{self.url}/offer", json=offer, headers=self._headers()) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    await self.pc.close()
                    raise ConnectionError(f"offer refused ({r.status}): {body.get('error')}")
        self.session_id = body["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(body["sdp"], body["type"]))

    def _on_track(self, track: MediaStreamTrack) -> None:
        consume = self._consume_video if track.kind == "video" else self._consume_audio
        self._tasks.append(asyncio.ensure_future(consume(track)))

    async def _consume_video(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.VideoFrame) and frame.pts is not None
                now = time.monotonic()
                rec = self.received
                rgb = frame.to_ndarray(format="rgb24")
                if self._record:
                    rec.video_pts.append(int(frame.pts))
                    rec.video_arrival.append(now)
                if self.keep_frames:
                    rec.frames.append(rgb)
                if self._on_video is not None:
                    self._on_video(rgb, int(frame.pts), now)
                if self._writer:
                    await asyncio.to_thread(self._writer.video, rgb, frame.pts)
                async with self._new_frame:
                    self._new_frame.notify_all()
        except MediaStreamError:
            pass

    async def _consume_audio(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=OUTPUT_RATE)
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame) and frame.pts is not None
                pts = int(frame.pts)
                frame.pts = None
                pcm = np.concatenate(
                    [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                    or [np.zeros(0, np.int16)]
                )
                now = time.monotonic()
                if self._record:
                    self.received.audio_pts.append(pts)
                    self.received.audio_arrival.append(now)
                    self.received.audio.append(pcm)
                if self._on_audio is not None:
                    self._on_audio(pcm, pts, now)
                if self._writer:
                    await asyncio.to_thread(self._writer.audio, pcm, pts)
        except MediaStreamError:
            pass

    def _on_message(self, raw: str | bytes) -> None:
        try:
            msg = json.loads(raw)
        except ValueError:
            log.warning("non-JSON data channel message: %r", raw)
            return
        msg["_t"] = time.monotonic()
        if self._record or msg.get("type") != "stats":  # a long call keeps no stats
            self.events.append(msg)
        if self._on_event is not None:
            self._on_event(msg)
        if msg.get("type") == "interrupted" and not self._interrupts.full():
            self._interrupts.put_nowait(int(msg["played_ms"]))
        task = asyncio.ensure_future(self._notify_event())
        self._notifiers.add(task)
        task.add_done_callback(self._notifiers.discard)

    async def _notify_event(self) -> None:
        async with self._new_event:
            self._new_event.notify_all()

    async def wait_frames(self, count: int, timeout: float = 60.0) -> None:
        """Wait until `count` video frames have arrived."""

        async def wait() -> None:
            async with self._new_frame:
                await self._new_frame.wait_for(lambda: len(self.received.video_pts) >= count)

        await asyncio.wait_for(wait(), timeout)

    async def wait_event(self, kind: str, timeout: float = 30.0, after: float = 0.0) -> dict:
        """Wait for a data-channel message of `kind` received after monotonic time `after`."""
        return await wait_for_event(self.events, self._new_event, kind, timeout, after)

    async def interrupt(self, timeout: float = 5.0) -> int:
        """Interrupt over the data channel; returns the played position in ms."""
        if self._channel.readyState != "open":
            raise ConnectionError("data channel is not open")
        self._channel.send(json.dumps({"type": "interrupt"}))
        return await asyncio.wait_for(self._interrupts.get(), timeout)

    async def close(self, release: bool = True) -> None:
        """Hang up; with `release`, also ask the server to drop the session right away."""
        if release and self.session_id:
            try:
                async with aiohttp.ClientSession() as http:
                    await http.delete(
                        f"{self.url}/sessions/{self.session_id}", headers=self._headers()
                    )
            except aiohttp.ClientError:
                pass
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        # Free the call without waiting for the garbage collector (realtime.connection).
        self._channel.remove_all_listeners()
        release_peer_connection(self.pc)
        if self._writer:
            await asyncio.to_thread(self._writer.close)


async def wait_until_ready(url: str, timeout: float = 300.0, process=None) -> dict:
    """Poll `GET /healthz` until the server's engine is warm (200); returns its body. With a
    `process` (a `subprocess.Popen` of `facecast serve`), fail at once if it exits."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"facecast serve exited with {process.returncode}")
            try:
                async with http.get(f"{url.rstrip('/')}/healthz") as r:
                    if r.status == 200:
                        return await r.json()
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} was not ready within {timeout:.0f} s")
