"""Facecast as a Pipecat avatar: `FacecastVideoService`, placed right after the TTS.

    from facecast_client.pipecat import FacecastVideoService

    avatar = FacecastVideoService(url="http://gpu-node:8080", token=TOKEN)   # remote
    # or FacecastVideoService(engine=engine) with a started `pipeline` engine, in-process
    pipeline = Pipeline([transport.input(), stt, llm, tts, avatar, transport.output()])

Shaped like Pipecat's own avatar services (Simli, HeyGen, Tavus): it consumes the TTS's
`TTSAudioRawFrame`s (they are not passed on), turns each `TTSStartedFrame` …
`TTSStoppedFrame` response into one utterance of Facecast's utterance channel
(`realtime.utterance`: the audio goes as fast as the TTS makes it), and emits the avatar:
`OutputImageRawFrame` video at 25 fps and the avatar's own `SpeechOutputAudioRawFrame`
audio, in sync with it (the audio the viewer is shown, nothing else: no idle silence). An
`InterruptionFrame` clears what is not yet played; the audio emitted for the utterance
stops where Facecast says it stopped playing (`playback_finished`). TTFB metrics run from
`TTSStartedFrame` to the moment the avatar starts saying it (`playback_started`, or a
`BotStartedSpeakingFrame`, whichever comes first). `StartFrame` connects, `EndFrame` lets
queued speech finish first, `CancelFrame` hangs up at once.

Two modes, one code path for everything after the connection (`facecast_client.links`):
- remote (`url=`): a `facecast serve` elsewhere (the usual deployment: the GPU node is
  not the bot's machine), through the project's WebRTC client with no microphone; the
  utterances go on its data channel;
- in-process (`engine=`): a `realtime.session.PeerSession` of this process around the
  engine, its paced tracks read directly (no codec, no network), the same messages handed
  to it.

`pipecat-ai` is the optional extra `facecast[pipecat]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputImageRawFrame,
    SpeechOutputAudioRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.ai_service import AIService

from facecast_client.links import LocalLink, RemoteLink
from facecast_client.speech import UtteranceSender
from pipeline.clock import OUTPUT_RATE, VIDEO_CLOCK
from pipeline.stream import Reference
from realtime.utterance import MAX_CHUNK_BYTES

RATE = OUTPUT_RATE  # the avatar's audio: mono int16
NS = 1_000_000_000
OUTBOX = 500  # the avatar's frames waiting for the pipeline (10 s of video)
HOLD_S = 1.0  # received audio kept until it is known to be (or not be) an utterance's
SYNC_WAIT_S = 0.2  # the longest a video frame waits for its audio
log = logging.getLogger(__name__)


@dataclass
class _Spoken:
    """One utterance as the service sees it: what it sent, what the avatar said back."""

    id: str
    sent: float = 0.0  # 48 kHz samples' worth of audio sent
    start: int | None = None  # avatar timeline sample where it started playing
    end: int | None = None  # where it stopped (playback_finished)
    cleared: bool = False  # a clear_buffer was sent while it was unfinished
    emitted: int = 0  # samples of it emitted as SpeechOutputAudioRawFrame
    position: float | None = None  # playback_position reported, seconds
    interrupted: bool = False


class FacecastVideoService(AIService):
    """A Facecast avatar in a Pipecat pipeline (see the module docstring)."""

    def __init__(
        self,
        *,
        url: str | None = None,
        token: str | None = None,
        engine: Any = None,
        reference: Reference | None = None,
        session_config: Any = None,
        seed: int = 0,
        end_timeout_s: float = 30.0,
        **kwargs,
    ) -> None:
        """`url` (and `token`) of a `facecast serve`, or a started `engine` to run here
        (with an optional `reference` RGB image and `realtime.session_config.SessionConfig`)."""
        if (url is None) == (engine is None):
            raise ValueError("FacecastVideoService needs url= (remote) or engine= (in-process)")
        super().__init__(**kwargs)
        if url is not None:
            self._link: RemoteLink | LocalLink = RemoteLink(url, token, seed)
        else:
            self._link = LocalLink(engine, reference, seed, session_config)
        self._end_timeout_s = end_timeout_s
        self._speech: UtteranceSender | None = None
        self._open: _Spoken | None = None  # receiving TTS audio
        self._open_format: tuple[int, int] | None = None  # (sample_rate, num_channels)
        self._spoken: deque[_Spoken] = deque()  # sent, not yet finished, in order
        self.finished: deque[_Spoken] = deque(maxlen=1000)  # the latest finished ones
        self._held: deque[tuple[int, np.ndarray]] = deque()  # received audio, its fate open
        self._all_finished = asyncio.Event()
        self._all_finished.set()
        self._ttfb_running = False
        self._connected = False
        self._video: deque[tuple[float, OutputImageRawFrame]] = deque()  # waiting for audio
        self._audio_clock = -1  # pts (ns) of the latest avatar audio received
        self._outbox: asyncio.Queue[Frame | _Call] = asyncio.Queue(OUTBOX)
        self._pusher_task: asyncio.Task | None = None
        self.dropped = 0  # frames the pipeline did not take in time

    @property
    def session_id(self) -> str | None:
        """The Facecast session (for its HTTP API: `/sessions/{id}`, stats)."""
        return self._link.session_id

    def can_generate_metrics(self) -> bool:
        return True

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        self._pusher_task = self.create_task(self._pusher())
        try:
            self._speech = await self._link.open(self._on_video, self._on_audio, self._on_event)
            self._connected = True
        except Exception as exc:
            await self.push_error(error_msg=f"Facecast: cannot connect: {exc}", exception=exc)

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._end_utterance()
        with contextlib.suppress(asyncio.TimeoutError):  # let queued speech be said
            await asyncio.wait_for(self._all_finished.wait(), self._end_timeout_s)
        await self._hang_up()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._hang_up()

    async def cleanup(self) -> None:
        await super().cleanup()
        await self._hang_up()

    async def _hang_up(self) -> None:
        if self._connected:
            self._connected = False
            await self._link.close()
        if self._pusher_task is not None:
            await self.cancel_task(self._pusher_task)
            self._pusher_task = None

    # ---- frames in -------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            await self._tts_audio(frame)  # consumed: the avatar's own audio goes on
            return
        if isinstance(frame, TTSStartedFrame):
            await self._end_utterance()
            self._begin(frame.context_id)
            await self.start_ttfb_metrics()
            self._ttfb_running = True
        elif isinstance(frame, TTSStoppedFrame):
            await self._end_utterance()
        elif isinstance(frame, InterruptionFrame):
            await self._clear()
        elif isinstance(frame, BotStartedSpeakingFrame):
            await self._stop_ttfb()
        await self.push_frame(frame, direction)

    def _begin(self, context_id: str | None) -> _Spoken:
        uid = f"{(context_id or 'tts')[:64]}-{uuid.uuid4().hex[:8]}"  # unique per utterance
        self._open = _Spoken(uid)
        self._open_format = None
        return self._open

    async def _tts_audio(self, frame: TTSAudioRawFrame) -> None:
        if self._speech is None or not frame.audio:
            return
        fmt = (frame.sample_rate, frame.num_channels)
        if self._open is not None and self._open_format not in (None, fmt):
            await self._end_utterance()  # the TTS changed format: a new utterance
        utt = self._open or self._begin(None)
        try:
            if self._open_format is None:
                self._open_format = fmt
                self._spoken.append(utt)
                self._all_finished.clear()
                await self._speech.start(utt.id, *fmt)
            audio = frame.audio
            step = MAX_CHUNK_BYTES - MAX_CHUNK_BYTES % (2 * frame.num_channels)
            for i in range(0, len(audio), step):
                await self._speech.audio(audio[i : i + step])
            utt.sent += len(audio) / (2 * frame.num_channels) * RATE / frame.sample_rate
        except ConnectionError as exc:
            await self.push_error(error_msg=f"Facecast: sending speech failed: {exc}")

    async def _end_utterance(self) -> None:
        utt, self._open = self._open, None
        if utt is not None and self._open_format is not None and self._speech is not None:
            with contextlib.suppress(ConnectionError):
                await self._speech.end(utt.id)
        self._open_format = None

    async def _clear(self) -> None:
        """Barge-in: everything sent and not yet played is dropped by the avatar."""
        await self._end_utterance()
        if not self._spoken or self._speech is None:
            return
        for utt in self._spoken:
            utt.cleared = True
        with contextlib.suppress(ConnectionError):
            await self._speech.clear_buffer()
        if self._ttfb_running:
            self._ttfb_running = False
            await self.cancel_ttfb_metrics()

    async def _stop_ttfb(self) -> None:
        if self._ttfb_running:
            self._ttfb_running = False
            await self.stop_ttfb_metrics()

    # ---- the avatar's media and events (event loop callbacks) ------------------------

    def _on_video(self, rgb: np.ndarray, pts: int) -> None:
        frame = OutputImageRawFrame(
            image=rgb.tobytes(), size=(rgb.shape[1], rgb.shape[0]), format="RGB"
        )
        frame.pts = pts * NS // VIDEO_CLOCK
        self._video.append((time.monotonic(), frame))
        self._release_video()

    def _release_video(self) -> None:
        """A frame goes on once the audio of its time has arrived (or after SYNC_WAIT_S):
        the receiver's audio path is slower than its video path (a jitter buffer), and
        Pipecat's output shows a frame when it gets it."""
        now = time.monotonic()
        while self._video:
            arrived, frame = self._video[0]
            if (frame.pts or 0) > self._audio_clock and now - arrived < SYNC_WAIT_S:
                return
            self._video.popleft()
            self._push_soon(frame)

    def _on_audio(self, pcm: np.ndarray, pts: int) -> None:
        self._audio_clock = pts * NS // RATE
        self._release_video()
        self._held.append((pts, pcm))
        self._release_audio()
        while self._held and self._held[-1][0] - self._held[0][0] > HOLD_S * RATE:
            self._held.popleft()  # idle audio no utterance claimed: never emitted

    def _release_audio(self) -> None:
        """Emit the held audio that is known to be the current utterance's, in order: up to
        what was sent while it plays, up to where it stopped once `playback_finished` says
        (after a clear, nothing until then: the cut is the avatar's to tell)."""
        while self._spoken:
            utt = self._spoken[0]
            start, end = utt.start, utt.end
            if start is None:
                return  # not playing yet
            if end is not None and utt.emitted >= end - start:
                self._finish(utt)
                continue
            if not self._held:
                return
            pts, pcm = self._held[0]
            if pts + pcm.size <= start:
                self._held.popleft()  # idle audio before it
                continue
            if end is None and utt.cleared:
                return
            bound = end if end is not None else start + round(utt.sent)
            lo, hi = max(pts, start), min(pts + pcm.size, bound)
            if hi < pts + pcm.size and end is None:
                return  # reaches past what is known to be it
            self._held.popleft()
            if hi > lo:
                self._emit_audio(utt, pcm[lo - pts : hi - pts], lo)
            if hi < pts + pcm.size:  # the rest is after it
                rest = max(hi, pts)
                self._held.appendleft((rest, pcm[rest - pts :]))
                self._finish(utt)

    def _emit_audio(self, utt: _Spoken, pcm: np.ndarray, at: int) -> None:
        frame = SpeechOutputAudioRawFrame(audio=pcm.tobytes(), sample_rate=RATE, num_channels=1)
        frame.pts = at * NS // RATE
        utt.emitted += pcm.size
        self._push_soon(frame)

    def _finish(self, utt: _Spoken) -> None:
        self._spoken.popleft()
        self.finished.append(utt)
        if not self._spoken:
            self._all_finished.set()

    def _on_event(self, event: dict) -> None:
        kind = event.get("type")
        utt = next((u for u in self._spoken if u.id == event.get("id")), None)
        if kind == "playback_started" and utt is not None:
            utt.start = int(event["at_sample"])
            self._task_soon(self._stop_ttfb())
        elif kind == "playback_finished" and utt is not None:
            utt.position = float(event["playback_position"])
            utt.interrupted = bool(event["interrupted"])
            utt.end = int(event["at_sample"])
            if utt.start is None:  # cleared before any of it was shown
                utt.start = utt.end
        elif kind == "error":
            log.warning("facecast: %s", event.get("message"))
        self._release_audio()

    def _push_soon(self, frame: Frame | _Call) -> None:
        # Media callbacks run on the loop outside this processor's coroutines: one pusher
        # task sends their frames on, in order.
        try:
            self._outbox.put_nowait(frame)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("facecast: the pipeline is not taking the avatar's frames")

    def _task_soon(self, coro) -> None:
        self._push_soon(_Call(coro))

    async def _pusher(self) -> None:
        while True:
            item = await self._outbox.get()
            if isinstance(item, _Call):
                await item.coro
            else:
                await self.push_frame(item)


@dataclass
class _Call:
    """A coroutine run by the pusher, in order with the frames around it."""

    coro: Any
