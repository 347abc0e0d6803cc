"""A Python WebRTC client for Facecast (aiortc): stream speech in, record the avatar out.

As a library (what an agent or a test uses):

    source = PcmSource.from_wav("hello.wav", speed=1.0)   # or PcmSource(); source.push(pcm)
    async with FacecastClient("http://127.0.0.1:8080", source, record_to="out.mp4") as c:
        await c.wait_frames(250)
        played_ms = await c.interrupt()
        print(call_stats(c))                                # realtime.call

An agent that pushes its TTS as utterances (`realtime.utterance`) connects without a
microphone and speaks through the data channel (or `SpeechSocket`, the WebSocket):

    async with FacecastClient(url, source=None) as c:
        await c.speech.say(pcm24k, 24_000)                   # one utterance, as fast as it goes
        finished = await c.wait_event("playback_finished")   # {id, playback_position, …}

The command line (`python -m realtime.call`) and the analysis of a call (frame rate, A/V
offset, round trip) live in `realtime.call`.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.clock import (
    OUTPUT_RATE,
    OUTPUT_SAMPLES_PER_PACKET,
    VIDEO_TICKS_PER_FRAME,
)
from pipeline.media import Mp4Writer, read_audio, resample, to_pcm16
from realtime.connection import release_peer_connection

log = logging.getLogger(__name__)


def read_pcm(path: str | Path) -> np.ndarray:
    """Any audio file → what a microphone sends: mono int16 at the playout rate."""
    return to_pcm16(read_audio(path, OUTPUT_RATE))


class PcmSource(MediaStreamTrack):
    """Outgoing microphone-like audio: queued PCM, then silence, 20 ms per frame.

    `speed` 1.0 sends in real time; 2.0 sends queued audio twice as fast (an agent pushing
    TTS ahead). After the queued audio runs out it keeps sending silence in real time, like
    a muted mic, so the call stays alive; `ended_at` is when the last queued sample was sent.
    """

    kind = "audio"

    def __init__(
        self, pcm: np.ndarray | None = None, speed: float = 1.0, loop: bool = False
    ) -> None:
        super().__init__()
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.speed = speed
        # (not `_loop`: aiortc's tracks keep their event loop under that name)
        self._clip = np.asarray(pcm, np.int16).reshape(-1) if loop and pcm is not None else None
        self._buf = np.zeros(0, np.int16)
        self.sent = np.zeros(0, np.int16)  # everything sent, for alignment
        self.sent_at: list[float] = []  # when each 20 ms frame of it was sent
        self._deadline = 0.0
        self._index = 0
        self._t0: float | None = None
        self.started_at: float | None = None  # monotonic time of the first frame
        self.ended_at: float | None = None
        if pcm is not None:
            self.push(pcm)

    @classmethod
    def from_wav(cls, path: str | Path, speed: float = 1.0, loop: bool = False) -> PcmSource:
        return cls(read_pcm(path), speed, loop)

    def push(self, pcm: np.ndarray, rate: int = OUTPUT_RATE) -> None:
        """Queue mono PCM (int16, or float in [-1, 1]; NaN/clipping tolerated)."""
        pcm = np.asarray(pcm).reshape(-1)
        if rate != OUTPUT_RATE:
            pcm = resample(pcm / 32768.0 if pcm.dtype == np.int16 else pcm, rate, OUTPUT_RATE)
        if pcm.dtype != np.int16:
            pcm = to_pcm16(pcm)
        self._buf = np.concatenate([self._buf, pcm])
        self.ended_at = None

    @property
    def queued(self) -> int:
        return self._buf.size

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = self.started_at = self._deadline = now
        if self._deadline > now:
            await asyncio.sleep(self._deadline - now)
        if (
            self._clip is not None and self._buf.size < OUTPUT_SAMPLES_PER_PACKET
        ):  # the clip again, seamlessly
            self._buf = np.concatenate([self._buf, self._clip])
        # queued audio goes at `speed`; the silence after it at real time, like a mic
        self._deadline += (
            OUTPUT_SAMPLES_PER_PACKET / OUTPUT_RATE / (self.speed if self._buf.size else 1.0)
        )
        self.sent_at.append(time.monotonic())
        chunk, self._buf = (
            self._buf[:OUTPUT_SAMPLES_PER_PACKET],
            self._buf[OUTPUT_SAMPLES_PER_PACKET:],
        )
        if chunk.size < OUTPUT_SAMPLES_PER_PACKET:
            if chunk.size or self.ended_at is None:
                self.ended_at = time.monotonic()
            chunk = np.concatenate(
                [chunk, np.zeros(OUTPUT_SAMPLES_PER_PACKET - chunk.size, np.int16)]
            )
        self.sent = np.concatenate([self.sent, chunk])
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        frame.pts = self._index * OUTPUT_SAMPLES_PER_PACKET
        frame.time_base = fractions.Fraction(1, OUTPUT_RATE)
        self._index += 1
        return frame


@dataclass
class Received:
    """What came back: video frames and audio, each with RTP-derived pts and arrival time."""

    video_pts: list[int] = field(default_factory=list)  # 90 kHz, first frame = 0
    video_arrival: list[float] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)  # kept when keep_frames
    audio_pts: list[int] = field(default_factory=list)  # 48 kHz
    audio_arrival: list[float] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)  # int16 mono per frame

    def audio_timeline(self) -> np.ndarray:
        """Received audio placed by pts (relative to the first packet), mono int16."""
        if not self.audio:
            return np.zeros(0, np.int16)
        base = self.audio_pts[0]
        end = max(p - base + a.size for p, a in zip(self.audio_pts, self.audio, strict=True))
        out = np.zeros(end, np.int16)
        for pts, pcm in zip(self.audio_pts, self.audio, strict=True):
            out[pts - base : pts - base + pcm.size] = pcm
        return out


class UtteranceSender:
    """The agent's side of the utterance channel (`realtime.utterance`), on any transport:
    `send` takes a JSON text or a binary PCM message."""

    def __init__(self, send: Callable[[str | bytes], Awaitable[None] | None]) -> None:
        self._send = send
        self.sent_at: dict[str, float] = {}  # utterance id → monotonic time of its start

    async def _out(self, data: str | bytes) -> None:
        result = self._send(data)
        if result is not None:
            await result

    async def start(self, uid: str, sample_rate: int, num_channels: int = 1) -> None:
        self.sent_at[uid] = time.monotonic()
        await self._out(
            json.dumps(
                {
                    "type": "utterance_start",
                    "id": uid,
                    "sample_rate": sample_rate,
                    "num_channels": num_channels,
                }
            )
        )

    async def audio(self, pcm: bytes) -> None:
        """int16 PCM of the open utterance, at most 64 KiB a message."""
        await self._out(pcm)

    async def end(self, uid: str) -> None:
        await self._out(json.dumps({"type": "utterance_end", "id": uid}))

    async def clear_buffer(self, uid: str | None = None) -> None:
        msg = {"type": "clear_buffer"} if uid is None else {"type": "clear_buffer", "id": uid}
        await self._out(json.dumps(msg))

    async def say(
        self,
        pcm: np.ndarray,
        sample_rate: int,
        uid: str | None = None,
        speed: float | None = None,
        chunk_ms: int = 40,
    ) -> str:
        """One whole utterance: int16 PCM (n,) or (n, channels), sent in `chunk_ms` pieces
        at `speed` times real time (None: as fast as the transport takes it). Returns its id."""
        uid = uid or uuid.uuid4().hex[:12]
        pcm = np.asarray(pcm, np.int16)
        frames = pcm.reshape(pcm.shape[0], -1)
        step = max(1, sample_rate * chunk_ms // 1000)
        await self.start(uid, sample_rate, frames.shape[1])
        t0 = time.monotonic()
        for i in range(0, frames.shape[0], step):
            await self.audio(frames[i : i + step].tobytes())
            if speed:
                due = t0 + (i + step) / sample_rate / speed
                await asyncio.sleep(max(0.0, due - time.monotonic()))
        await self.end(uid)
        return uid


class SpeechSocket:
    """The utterance channel over the WebSocket `/sessions/{id}/speech`; `events` collects
    what the server sends on it (each with "_t", monotonic)."""

    def __init__(self, url: str, session_id: str, token: str | None = None) -> None:
        base = url.rstrip("/")
        self.url = f"{base}/sessions/{session_id}/speech"
        self.token = token
        self.events: list[dict] = []
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse[bool] | None = None
        self._reader: asyncio.Task | None = None
        self._new_event = asyncio.Condition()
        self.speech = UtteranceSender(self._send)

    async def connect(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = aiohttp.ClientSession()
        try:
            self._ws = await self._http.ws_connect(self.url, headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            await self._http.close()
            raise ConnectionError(f"speech socket refused ({exc.status}): {exc.message}") from exc
        self._reader = asyncio.ensure_future(self._read())

    async def _send(self, data: str | bytes) -> None:
        assert self._ws is not None, "connect() first"
        if isinstance(data, str):
            await self._ws.send_str(data)
        else:
            await self._ws.send_bytes(data)

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                event["_t"] = time.monotonic()
                self.events.append(event)
                async with self._new_event:
                    self._new_event.notify_all()

    async def wait_event(self, kind: str, timeout: float = 30.0, after: float = 0.0) -> dict:
        return await _wait_event(self.events, self._new_event, kind, timeout, after)

    @property
    def closed(self) -> bool:
        return self._ws is None or self._ws.closed

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._http is not None:
            await self._http.close()


async def _wait_event(
    events: list[dict], condition: asyncio.Condition, kind: str, timeout: float, after: float
) -> dict:
    def found() -> dict | None:
        return next((e for e in events if e["type"] == kind and e["_t"] > after), None)

    async def wait() -> None:
        async with condition:
            await condition.wait_for(lambda: found() is not None)

    await asyncio.wait_for(wait(), timeout)
    return found()  # type: ignore[return-value]


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
        return await _wait_event(self.events, self._new_event, kind, timeout, after)

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


class CallRecorder:
    """Records the call to MP4 (`pipeline.media.Mp4Writer`), video placed by its RTP
    timestamps. Thread-safe: the video and audio consumers call it from worker threads,
    and one container must not be muxed into from two threads at once. The file is opened
    at the first frame (its size); audio before it is not recorded."""

    def __init__(self, path: str | Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._writer: Mp4Writer | None = None
        self._v0 = 0

    def video(self, rgb: np.ndarray, pts: int) -> None:
        with self._lock:
            if self._writer is None:
                self._writer = Mp4Writer(self._path, rgb.shape[1], rgb.shape[0])
                self._v0 = pts
            index = round((pts - self._v0) / VIDEO_TICKS_PER_FRAME)
            self._writer.write_frames(rgb[None], start=index)

    def audio(self, pcm: np.ndarray, pts: int) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.write_audio(pcm.astype(np.float32) / 32768.0)

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
