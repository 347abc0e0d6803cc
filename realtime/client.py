"""A Python WebRTC client for Facecast (aiortc): stream speech in, record the avatar out.

As a library (what an agent or a test uses):

    source = PcmSource.from_wav("hello.wav", speed=1.0)   # or PcmSource(); source.push(pcm)
    async with FacecastClient("http://127.0.0.1:8080", source, record_to="out.mp4") as c:
        await c.wait_frames(250)
        played_ms = await c.interrupt()
        print(c.stats())

An agent that pushes its TTS as utterances (`realtime.utterance`) connects without a
microphone and speaks through the data channel (or `SpeechSocket`, the WebSocket):

    async with FacecastClient(url, source=None) as c:
        await c.speech.say(pcm24k, 24_000)                   # one utterance, as fast as it goes
        finished = await c.wait_event("playback_finished")   # {id, playback_position, …}

As a command: `python -m realtime.client http://127.0.0.1:8080 --wav hello.wav --out a.mp4`
prints time to first frame, fps and the A/V offset as JSON (`--utterance` sends the WAV
through the utterance channel instead of the microphone track).

The A/V offset is measured from timestamps: both received tracks are placed on their RTP
timelines (video frame n at n·40 ms, audio by sample), the received audio is aligned with
the audio that was sent by cross-correlation, and the offset is where the sent content
appears in the returned audio relative to the video frame generated from it.
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import logging
import sys
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
    FPS,
    MODEL_RATE,
    OUTPUT_RATE,
    OUTPUT_SAMPLES_PER_PACKET,
    VIDEO_CLOCK,
    VIDEO_TICKS_PER_FRAME,
)
from pipeline.media import Mp4Writer, read_audio, resample, to_pcm16
from realtime.teardown import release_peer_connection

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
        # Free the call without waiting for the garbage collector (realtime.teardown).
        self._channel.remove_all_listeners()
        release_peer_connection(self.pc)
        if self._writer:
            await asyncio.to_thread(self._writer.close)

    def stats(self) -> dict:
        rec = self.received
        out: dict = {"frames": len(rec.video_pts), "session_id": self.session_id}
        src = self.source
        if src is not None and src.started_at is not None and rec.video_arrival:
            out["ttff_ms"] = round((rec.video_arrival[0] - src.started_at) * 1000)
        if len(rec.video_arrival) > 1:
            span = rec.video_arrival[-1] - rec.video_arrival[0]
            out["fps"] = round((len(rec.video_arrival) - 1) / span, 2)
            pts_span = (rec.video_pts[-1] - rec.video_pts[0]) / VIDEO_CLOCK
            out["fps_pts"] = round((len(rec.video_pts) - 1) / pts_span, 2) if pts_span else None
        timeline = as_timeline(src.sent if src else np.zeros(0, np.int16), self.events)
        offset = av_offset_ms(rec, timeline)
        if offset is not None:
            out["av_offset_ms"] = round(offset, 1)
        out["arrival_skew_ms"] = arrival_skew_ms(rec)
        if len(rec.video_arrival) > 1:
            out["max_gap_ms"] = round(float(np.diff(rec.video_arrival).max()) * 1000, 1)
        out.update(self.round_trip())
        server = [e for e in self.events if e.get("type") == "stats"]
        if server:  # the server's own counters (fresh share, latencies), last report
            out["server"] = {k: v for k, v in server[-1].items() if k not in ("type", "_t")}
        return out

    def round_trip(self) -> dict:
        """Outside latency: each returned 20 ms of audio (in sync with the lips: see
        `av_offset_ms`) against when the client sent the audio it carries. The server's
        timeline is the sent audio plus inserted silence (`as_timeline`), so returned pts
        P carries sent sample `sent_index(P)`; speech only (silence has nothing to match)."""
        rec, src = self.received, self.source
        if src is None or not rec.audio_pts or src.started_at is None:
            return {}
        inserted = [
            (int(e["at_ms"] * OUTPUT_RATE // 1000), int(e["added_ms"] * OUTPUT_RATE // 1000))
            for e in self.events
            if e.get("type") == "delay_grown"
        ]
        base = rec.audio_pts[0]
        loud = np.abs(src.sent.astype(np.int32))
        lat = []
        for pts, arrived in zip(rec.audio_pts, rec.audio_arrival, strict=True):
            pos = pts - base
            shift = sum(n for at, n in inserted if at <= pos)
            if any(at <= pos < at + n for at, n in inserted):
                continue  # inserted silence was never sent
            sample = pos - shift
            if (
                0 <= sample < loud.size - OUTPUT_SAMPLES_PER_PACKET
                and loud[sample : sample + OUTPUT_SAMPLES_PER_PACKET].max() > 1000
            ):
                lat.append(arrived - src.sent_at[sample // OUTPUT_SAMPLES_PER_PACKET])
        if not lat:
            return {}
        lat.sort()
        return {
            "round_trip_p50_ms": round(lat[len(lat) // 2] * 1000),
            "round_trip_p95_ms": round(lat[int(len(lat) * 0.95)] * 1000),
        }


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


def as_timeline(sent: np.ndarray, events: list[dict]) -> np.ndarray:
    """The sent audio as the server's session timeline holds it: with the silence the
    server inserted (`delay_grown {at_ms, added_ms}`, timeline positions) to grow its
    playout delay while nobody spoke."""
    parts, done, shift = [], 0, 0  # `done`: sent samples placed; `shift`: inserted so far
    for event in events:
        if event.get("type") != "delay_grown":
            continue
        at = int(event["at_ms"] * OUTPUT_RATE // 1000) - shift  # in sent-audio samples
        parts += [sent[done:at], np.zeros(int(event["added_ms"] * OUTPUT_RATE // 1000), sent.dtype)]
        done, shift = max(done, at), shift + int(event["added_ms"] * OUTPUT_RATE // 1000)
    return np.concatenate([*parts, sent[done:]])


def av_offset_ms(rec: Received, timeline: np.ndarray, max_lag_s: float = 1.0) -> float | None:
    """Where the sent audio appears in the returned audio, in ms, against the video.

    Video frame n (pts n·3600) is generated from timeline [n·40, (n+1)·40) ms (the sent
    audio with the server's inserted silence: `as_timeline`), so a returned audio stream in
    sync with the video carries timeline time t at audio pts t: lag 0.
    """
    got = rec.audio_timeline().astype(np.float32)
    ref = timeline.astype(np.float32)
    n = min(got.size, ref.size)
    if n < OUTPUT_RATE or not rec.video_pts or np.abs(ref[:n]).max() == 0 or np.abs(got).max() == 0:
        return None
    # Both timelines start at their stream's first packet; video pts 0 is frame 0.
    lag = _best_lag(got[:n], ref[:n], int(max_lag_s * OUTPUT_RATE))
    video_origin = rec.video_pts[0] / VIDEO_CLOCK  # nonzero only if frame 0 was lost
    return lag / OUTPUT_RATE * 1000 - video_origin * 1000


def _best_lag(got: np.ndarray, ref: np.ndarray, max_lag: int) -> int:
    size = 1 << int(np.ceil(np.log2(got.size + ref.size)))
    corr = np.fft.irfft(np.fft.rfft(got, size) * np.conj(np.fft.rfft(ref, size)), size)
    lags = np.concatenate([np.arange(0, max_lag + 1), np.arange(-max_lag, 0)])
    values = np.concatenate([corr[: max_lag + 1], corr[size - max_lag :]])
    return int(lags[int(np.argmax(values))])


def arrival_skew_ms(rec: Received) -> float | None:
    """Median (arrival − pts time) of video minus that of audio: how far apart they arrive."""
    if not rec.video_pts or not rec.audio_pts:
        return None
    v = np.median(np.array(rec.video_arrival) - np.array(rec.video_pts) / VIDEO_CLOCK)
    a0 = rec.audio_pts[0]
    a = np.median(np.array(rec.audio_arrival) - (np.array(rec.audio_pts) - a0) / OUTPUT_RATE)
    return round(float(v - a) * 1000, 1)


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


# ---- command line --------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict:
    if args.wav:
        pcm = await asyncio.to_thread(read_pcm, args.wav)
    else:
        raw = np.frombuffer(await asyncio.to_thread(Path(args.pcm).read_bytes), np.int16)
        pcm = to_pcm16(resample(raw / 32768.0, args.pcm_rate, OUTPUT_RATE))
    seconds = args.seconds or (pcm.size / OUTPUT_RATE + 3.0)
    if args.utterance:  # no microphone: the WAV is one utterance on the data channel
        client = FacecastClient(args.url, None, token=args.token, record_to=args.out)
        await client.connect()
        try:
            await client.wait_channel_open()
            await client.wait_frames(FPS, timeout=60)  # on screen, idle
            sent = time.monotonic()
            await client.speech.say(pcm, OUTPUT_RATE, speed=args.speed)
            started = await client.wait_event("playback_started", 60, sent)
            finished = await client.wait_event("playback_finished", seconds + 60, sent)
        finally:
            await client.close()
        stats = client.stats()
        stats["playback_started_ms"] = round((started["_t"] - sent) * 1000)
        stats["playback_position_s"] = finished["playback_position"]
    else:
        source = PcmSource(pcm, speed=args.speed, loop=args.loop)
        client = FacecastClient(args.url, source, token=args.token, record_to=args.out)
        await client.connect()
        try:
            await asyncio.sleep(seconds)
        finally:
            await client.close()
        stats = client.stats()
    counts: dict[str, int] = {}
    for e in client.events:
        counts[e["type"]] = counts.get(e["type"], 0) + 1
    stats["events"] = counts
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m realtime.client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--wav", help="audio file to send (any format PyAV reads)")
    src.add_argument("--pcm", help="raw s16le mono PCM file to send")
    parser.add_argument("--pcm-rate", type=int, default=MODEL_RATE)
    parser.add_argument("--speed", type=float, default=1.0, help=">1 sends faster than real time")
    parser.add_argument(
        "--seconds", type=float, default=0, help="call length (default: audio + 3 s)"
    )
    parser.add_argument("--loop", action="store_true", help="send the audio again and again")
    parser.add_argument(
        "--utterance",
        action="store_true",
        help="no microphone: send the audio as one utterance (at --speed) on the data channel",
    )
    parser.add_argument("--out", help="record the returned avatar to this MP4")
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stats = asyncio.run(run(args))
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
