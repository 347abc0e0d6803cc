"""One peer: incoming audio → timeline → VAD → engine worker → paced A/V tracks, and events.

Flow of one session (all on the event loop except the engine, which has its own thread):

    peer audio track ──recv──▶ InputResampler ──48k──▶ PlaybackTimeline ──▶ AvatarAudioTrack
                                       └─16k─▶ VadThread (events)
                                       └─16k─▶ GenerationWorker ──▶ FrameQueue ──▶ AvatarVideoTrack

Silence is part of the timeline: the peer's silent frames flow like speech, and if the
peer stops sending, digital silence is padded so the avatar keeps moving (idle). A peer
that sends nothing for `peer_timeout_s` is treated as gone and the session closes.
Output frames and audio are also handed to `sinks` (e.g. the KVS mirror) as they are sent.

Playout follows the latency budget (`realtime.playout`). The first 0.1 s of audio tells a
microphone (real time) from an agent pushing faster; a microphone's timeline then starts
with a pre-roll of silence, so the first step runs at once and the avatar appears, idle,
within a step's time, while speech meets its frames at the budget's delay. If generation
gets slower than planned, the delay is re-planned after each utterance and grown only while
nobody speaks, by inserting silence: the avatar idles a little longer, no frame is late.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.clock import (
    FPS,
    MODEL_SAMPLES_PER_FRAME,
    OUTPUT_RATE,
    OUTPUT_SAMPLES_PER_FRAME,
    OUTPUT_SAMPLES_PER_MODEL_SAMPLE,
)
from pipeline.stream import AvatarStream
from realtime.audio_in import InputResampler, PlaybackTimeline
from realtime.errors import RealtimeError, SessionClosed
from realtime.events import PlaybackTracker, message, parse_client_message
from realtime.generation import ChunkStats, GenerationWorker
from realtime.metrics import RealtimeMetrics
from realtime.playout import PROBE_S, EngineTiming, PlayoutBudget, PlayoutControl
from realtime.teardown import release_peer_connection
from realtime.tracks import (
    AvatarAudioTrack,
    AvatarVideoTrack,
    FrameQueue,
    MediaSink,
)
from realtime.utterance import UTTERANCE_MESSAGES, UtteranceChannel
from realtime.vad import VadEvent, VadThread, VoiceActivityDetector

log = logging.getLogger(__name__)


@dataclass
class SessionConfig:
    lead_s: float = 2.0  # generation may run at most this far ahead of playout (or the delay)
    # Added to the playout budget: covers the spread of step times and event-loop latency.
    playout_margin_s: float = 0.1
    # A fixed delay from the first audio to the first frame instead of the budget (tests).
    playout_delay_s: float | None = None
    peer_timeout_s: float = 5.0  # no incoming audio for this long: the peer is gone
    # Digital silence is padded up to `fill_margin_s` behind the wall clock when the peer
    # has been quiet for `fill_after_s`, or has fallen `fill_drift_s` behind (its audio
    # clock runs slow). A peer merely late by less (a stalled sender about to burst) gets
    # nothing inserted into its speech.
    fill_after_s: float = 0.5
    fill_drift_s: float = 0.6
    fill_margin_s: float = 0.3
    max_input_ahead_s: float = 120.0  # agent audio buffered beyond playout
    # After an interrupt, frames already made from the flushed speech are shown for at
    # most this long (one engine chunk), while the engine makes the next ones.
    interrupt_tail_s: float = 0.48
    # An utterance (realtime.utterance) whose stream sends nothing for this long is ended.
    utterance_idle_s: float = 10.0
    seed: int = 0


class PeerSession:
    """A live peer. Create, `attach` to the negotiated peer connection, then `close`."""

    def __init__(
        self,
        session_id: str,
        pc: RTCPeerConnection,
        open_engine_stream: Callable[[int], AvatarStream],
        video_size: tuple[int, int],
        config: SessionConfig,
        metrics: RealtimeMetrics,
        on_closed: Callable[[PeerSession], Awaitable[None]],
        vad: VoiceActivityDetector,
        timing: EngineTiming,
        engine_lock: threading.Lock | None = None,
    ) -> None:
        self.id = session_id
        self.pc = pc
        self.video_size = video_size  # (width, height)
        self.offer_options: dict[str, Any] = {}  # what the peer asked for (e.g. kvs_stream)
        self.config = config
        self.metrics = metrics
        self.created = time.time()
        self.state = "new"  # new → live → closed
        self.close_reason = ""
        self.sinks: list[MediaSink] = []  # attach mirrors here before media flows
        self.ttff_s: float | None = None
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task] = set()
        self._channel: RTCDataChannel | None = None
        self._unsent: list[str] = []  # events before the data channel opened
        self._first_audio: float | None = None
        self._last_rx: float | None = None  # the timeline's input (microphone or utterances)
        self._last_mic: float | None = None  # the microphone track: is the peer there?
        self.listeners: list[Callable[[str], None]] = []  # more event receivers (WebSockets)
        self._overfull_logged = False
        # (frame due at the interrupt, first re-timed frame, first frame of new audio)
        self.last_interrupt: tuple[int, int, int] | None = None
        self._closing: asyncio.Task | None = None

        self.timeline = PlaybackTimeline(config.max_input_ahead_s)
        self._resampler = InputResampler()
        self.vad = VadThread(vad, self._loop, self._on_vad, name=f"vad-{session_id[:8]}")
        self.playback = PlaybackTracker(self._send)
        self.speech = UtteranceChannel(
            self._push_speech,
            self.interrupt,
            self._send,
            config.utterance_idle_s,
            splice=self._splice_utterance,
            on_finished=lambda cut: metrics.utterances.labels(
                "interrupted" if cut else "played"
            ).inc(),
        )
        self.timing = timing
        self._heard_speech = False
        self._last_speech_start = 0.0
        # (timeline head after an append, its arrival time or None for inserted silence):
        # what speech-to-lips is measured from; trimmed as frames are sent
        self._arrivals: deque[tuple[int, float | None]] = deque()
        self.speech_to_lips: deque[float] = deque(maxlen=3000)  # seconds, recent frames
        self.generated = 0
        self.first_step_s: float | None = None  # wall time of the engine's first step
        lead = max(1, int(config.lead_s * FPS))
        self.frames = FrameQueue(lead, capacity=lead + 10 * FPS)
        self.playout = PlayoutControl(
            timing,
            self.frames,
            metrics,
            self._ingest,
            self._send,
            lambda: self.worker.step_seconds,
            config.playout_margin_s,
            config.playout_delay_s,
        )
        self.clock = self.playout.clock
        self.worker = GenerationWorker(
            lambda: open_engine_stream(config.seed),
            self.frames,
            self.clock,
            self._loop,
            self._on_chunk,
            self._on_worker_error,
            session_id,
            step=self.playout.steady_step,
            step_seconds=timing.steady_seconds,
            margin_s=config.playout_margin_s + timing.spread * timing.steady_seconds,
            engine_lock=engine_lock,
        )
        self.video = AvatarVideoTrack(
            self.clock,
            self.frames,
            video_size,
            metrics,
            self.sinks,
            session_id,
            on_sent=self._on_sent,
        )
        self.audio = AvatarAudioTrack(
            self.clock, self.timeline, self.sinks, session_id, self._on_played
        )
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start generation (after the answer is set); media flows once audio arrives."""
        if self.state != "new":
            raise SessionClosed(f"session {self.id} is {self.state}, cannot start")
        self.state = "live"
        self.worker.start()
        self._spawn(self._watchdog(), "watchdog")
        if not self._receives_audio():
            # No microphone (an agent speaking only through utterances): the avatar idles
            # from now on, as after a microphone's silent first audio.
            self._first_audio = self._last_rx = time.monotonic()
            self.playout.decide_start(self._first_audio)

    def _receives_audio(self) -> bool:
        return any(
            t.kind == "audio" and t.currentDirection in ("sendrecv", "recvonly")
            for t in self.pc.getTransceivers()
        )

    def close(self, reason: str = "closed") -> asyncio.Task:
        """Close once (idempotent); returns the task doing it so callers may await it."""
        if self._closing is None:
            self.close_reason = reason
            self._closing = self._loop.create_task(self._close())
        return self._closing

    async def _close(self) -> None:
        log.info("session %s: closing (%s)", self.id, self.close_reason)
        self.state = "closed"
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self.worker.stop()
        self.vad.close()
        self._send(message("session_closed", reason=self.close_reason))
        try:
            self.video.stop()
            self.audio.stop()
            await self.pc.close()
        except Exception:
            log.exception("session %s: peer connection close failed", self.id)
        finally:
            # generate_ready() may be mid-chunk: the thread stops after it.
            if not await self.worker.wait_exited(30.0):
                log.error("session %s: generation thread did not stop", self.id)
            await asyncio.gather(
                *(t for t in self._tasks if t is not current), return_exceptions=True
            )
            await self._close_sinks()
            await self._on_closed(self)
            self._release()

    def _release(self) -> None:
        """Break the cycles through this closed session (peer and channel listeners, track,
        worker, playback and playout callbacks), so dropping it frees the call at once instead of at
        the next full garbage collection (see `realtime.teardown`)."""
        if self.pc.connectionState == "closed":
            release_peer_connection(self.pc)
        if self._channel is not None:
            self._channel.remove_all_listeners()
        self.worker.release()
        self.playback.detach()
        self.speech.detach()
        self.playout.detach()
        self.listeners.clear()

    async def _close_sinks(self) -> None:
        """Sinks with a `close()` (sync or async, e.g. a KVS mirror flushing) are closed."""
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is None:
                continue
            try:
                result = close()
                if inspect.isawaitable(result):
                    await asyncio.wait_for(result, 15.0)
            except Exception:
                log.exception("session %s: closing sink %r failed", self.id, sink)

    @property
    def tasks(self) -> set[asyncio.Task]:
        return set(self._tasks)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = self._loop.create_task(coro, name=f"{name}-{self.id[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.close(f"connection {self.pc.connectionState}")

    # ---- incoming audio --------------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._receive(track), "audio-in")

    async def _receive(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame), "an audio track yields audio frames"
                self._last_mic = time.monotonic()
                if self.speech.active:
                    continue  # utterances feed the timeline now; the mic says "still here"
                self._last_rx = self._last_mic
                if self._first_audio is None:
                    self._first_audio = self._last_rx
                pcm48 = self._resampler.mono48(frame)
                if self.playout.planned is None:
                    self.playout.probe(pcm48, self._last_rx, self._first_audio)
                else:
                    self._ingest(pcm48, self._last_rx)
        except MediaStreamError:
            self.close("peer ended its audio track")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: audio input failed", self.id)
            self._fail(exc)

    def _push_speech(self, pcm48: np.ndarray, placed: Callable[[int | None], None]) -> None:
        """Utterance audio (`realtime.utterance`) joins the timeline as a microphone's would;
        `placed` gets its timeline position once it is there (None if refused)."""
        self._last_rx = time.monotonic()
        if self._first_audio is None:
            self._first_audio = self._last_rx
        if self.playout.planned is None:
            self.playout.probe(pcm48, self._last_rx, self._first_audio, placed)
        else:
            placed(self._ingest(pcm48, self._last_rx))

    def _ingest(self, pcm48: np.ndarray, arrived: float | None = None) -> int | None:
        """Append to the timeline; VAD and the engine see the same audio. `arrived` is the
        peer audio's arrival time (None for silence the session inserts). Returns the
        position of the first sample, None when the buffer is full and it was dropped."""
        if self.timeline.overfull():
            if not self._overfull_logged:  # once per episode, not 50 times a second
                self._overfull_logged = True
                log.warning(
                    "session %s: input is %.0f s ahead of playout, dropping audio",
                    self.id,
                    self.config.max_input_ahead_s,
                )
            return None
        self._overfull_logged = False
        at = self.timeline.append(pcm48)
        self._arrivals.append((self.timeline.head, arrived))
        pcm16 = self._resampler.to16(pcm48)
        self.vad.feed(pcm16)
        self.worker.push(pcm16)
        if arrived is None:
            self.speech.silence_inserted(at, pcm48.size)
        return at

    def _on_vad(self, event: VadEvent) -> None:
        if self.state == "closed":
            return
        self.metrics.vad_transitions.labels(event.kind).inc()
        at48 = event.sample * OUTPUT_SAMPLES_PER_MODEL_SAMPLE
        # Playbacks are VAD segments of a microphone; an agent's utterances say their own.
        segments = not self.speech.active
        if event.kind == "speech_started":
            self._heard_speech = True
            self._last_speech_start = time.monotonic()
            if segments:
                self.playback.speech_started(at48)
        else:
            if segments:
                self.playback.speech_stopped(at48)
            self.playout.replan()  # between utterances: the only time the delay may change
        self._send(message(event.kind, at_ms=round(event.ms)))

    async def _watchdog(self) -> None:
        """Keep the timeline moving when the peer goes quiet; close when it vanished; grow
        the playout delay while nobody speaks; report stats to the peer once a second."""
        tick = 0.1
        ticks = 0
        while True:
            await asyncio.sleep(tick)
            ticks += 1
            if ticks % 10 == 0:
                self._send(message("stats", **self.stats()))
            if self.playout.planned is None and self._first_audio is not None:
                if time.monotonic() - self._first_audio >= PROBE_S:
                    self.playout.decide_start(self._first_audio)  # quiet during the probe
            self.playout.grow(self.timeline.head, self._last_rx, self._quiet())
            self.speech.tick(time.monotonic())
            mic = None if self._last_mic is None else time.monotonic() - self._last_mic
            if mic is not None and mic > self.config.peer_timeout_s:
                self.close(f"no audio from the peer for {self.config.peer_timeout_s:.0f} s")
                return
            last = self._last_audio_age()
            if self._first_audio is None:
                if time.time() - self.created > self.config.peer_timeout_s + 10:
                    self.close("the peer never sent audio")
                    return
                continue
            if self.speech.open is not None:
                self._fill_utterance()
                continue
            elapsed = time.monotonic() - self._first_audio + self.playout.inserted_s
            behind = elapsed - self.timeline.head / OUTPUT_RATE
            quiet = (last or 0.0) > self.config.fill_after_s
            if (quiet and behind > self.config.fill_margin_s) or behind > self.config.fill_drift_s:
                pad = int((behind - self.config.fill_margin_s) * OUTPUT_RATE)
                self._ingest(np.zeros(pad, np.int16))

    def _fill_utterance(self) -> None:
        """While an utterance arrives, silence goes into it only if its stream stalled and
        playout would otherwise run out of audio (a TTS slower than real time); the
        utterance does not count it."""
        t0, utt = self.clock.t0, self.speech.open
        if t0 is None or utt is None:
            return
        if time.monotonic() - utt.last_data < self.config.fill_after_s:
            return
        need = self.config.interrupt_tail_s + 2 * self.worker.step_seconds
        lead = self.timeline.head / OUTPUT_RATE - (time.monotonic() - t0)
        if lead < need:
            self._ingest(np.zeros(int((need - lead) * OUTPUT_RATE), np.int16))

    def _last_audio_age(self) -> float | None:
        return None if self._last_rx is None else time.monotonic() - self._last_rx

    # ---- generation callbacks (event loop) -------------------------------------------

    def _on_chunk(self, stats: ChunkStats) -> None:
        if self.clock.t0 is None:
            self.first_step_s = stats.seconds
            self.playout.start(self._first_audio)
        duration = stats.frames / FPS
        self.generated += stats.frames
        self.metrics.frames_generated.inc(stats.frames)
        self.metrics.chunk_generation.observe(stats.seconds)
        self.metrics.chunk_duration.observe(duration)
        self.metrics.realtime_factor.observe(stats.seconds / duration)
        if stats.skipped:
            self.metrics.frames_skipped.inc(stats.skipped)

    def _quiet(self) -> bool:
        """Nobody speaks: no speech, no utterance open, and no speech start that may still be
        on its way from the VAD thread (the playout delay grows only then)."""
        return (
            not self.vad.speaking
            and self.speech.open is None
            and time.monotonic() - self._last_speech_start >= 0.5
        )

    @property
    def budget(self) -> PlayoutBudget | None:
        return self.playout.budget

    @property
    def playout_delay_s(self) -> float | None:
        return self.playout.delay_s

    # ---- frames sent (event loop) ----------------------------------------------------

    def _on_played(self, position: int) -> None:
        """The audio track sent timeline samples up to `position`."""
        self.playback.played(position)
        self.speech.played(position)

    def _on_sent(self, index: int, fresh: bool) -> None:
        now = time.monotonic()
        if self.ttff_s is None and self._first_audio is not None:
            self.ttff_s = now - self._first_audio
            self.metrics.ttff.observe(self.ttff_s)
        # the frame shows timeline audio [index, index + 1) frames; its middle sample's
        # arrival starts the frame's speech-to-lips latency
        middle = index * OUTPUT_SAMPLES_PER_FRAME + OUTPUT_SAMPLES_PER_FRAME // 2
        while len(self._arrivals) > 1 and self._arrivals[0][0] <= middle:
            self._arrivals.popleft()
        if not fresh or not self._arrivals:
            return
        head, arrived = self._arrivals[0]
        if head > middle and arrived is not None:
            latency = now - arrived
            self.speech_to_lips.append(latency)
            self.metrics.speech_to_lips.observe(latency)

    def _on_worker_error(self, exc: BaseException) -> None:
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.metrics.session_errors.inc()
        self._send(message("error", message=f"{type(exc).__name__}: {exc}"))
        self.close(f"error: {type(exc).__name__}")

    # ---- agent control ---------------------------------------------------------------

    def interrupt(self) -> int:
        """Flush queued speech: its sound stops at once; generated frames beyond one chunk
        (`interrupt_tail_s`) are dropped, so lips stop after that chunk plus the audio the
        engine already holds, and the video never freezes. New input (or idle) follows, in
        sync. Returns the ms of the current speech segment (or utterance) that were played."""
        if self.state != "live":
            raise SessionClosed(f"session {self.id} is {self.state}; cannot interrupt")
        played_ms = self.playback.interrupt()
        utterance_ms = self.speech.cut(self.audio.position)
        if self.speech.active:  # the agent's utterances are what is being said
            played_ms = utterance_ms
        self._flush()
        self._send(message("interrupted", played_ms=played_ms))
        return played_ms

    def _flush(self) -> None:
        """Drop the queued input from one chunk past the playout position on (frames,
        timeline, VAD); the next input is placed right after what the engine holds."""
        now = self.clock.frame_now()
        tail = math.ceil(self.config.interrupt_tail_s * FPS)
        cut = max(now, min(now + tail, self.worker.next_index()))
        self.frames.truncate(cut)
        new_audio = self.worker.rebase(cut)
        self.timeline.cut_at(new_audio * OUTPUT_SAMPLES_PER_FRAME)
        while self._arrivals and self._arrivals[-1][0] > self.timeline.head:
            self._arrivals.pop()  # audio that is gone: speech-to-lips follows what is kept
        self._arrivals.append((self.timeline.head, None))
        self.timeline.mute(self.audio.position, new_audio * OUTPUT_SAMPLES_PER_FRAME)
        self.last_interrupt = (now, cut, new_audio)
        stop = self.vad.reset_at(new_audio * MODEL_SAMPLES_PER_FRAME)
        if stop is not None:
            self.metrics.vad_transitions.labels(stop.kind).inc()
            self._send(message(stop.kind, at_ms=round(stop.ms), interrupted=True))

    def _splice_utterance(self) -> None:
        """An utterance begins while the avatar idles: the idle audio queued ahead of
        playout (a whole playout delay of it) is dropped as an interrupt drops speech, so
        the utterance is said one chunk from now instead of after that queue."""
        if self.state == "live" and self.clock.t0 is not None and not self.vad.speaking:
            self._flush()
            # A slow engine could not make the utterance's first frames by the time they
            # are due (the worker would skip speech): a little more idle goes first.
            ready = self.clock.frame_now() + math.ceil(self.worker.frames_ahead_needed())
            short = ready * OUTPUT_SAMPLES_PER_FRAME - self.timeline.head
            if short > 0:
                self._ingest(np.zeros(short, np.int16))

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        self._channel = channel
        channel.on("open", lambda: self._send_unsent())
        self._send_unsent()

        channel.on("message", lambda raw: self.handle_message(raw, self._send_channel))

    def handle_message(self, raw: str | bytes, reply: Callable[[str], None]) -> None:
        """One message from the peer (data channel, or the WebSocket `/speech`); a bad one
        is answered with an `error` through `reply`, and the session goes on."""
        try:
            if self.state != "live":
                raise SessionClosed(f"session {self.id} is {self.state}")
            if isinstance(raw, bytes | bytearray):
                self.speech.handle_audio(raw)
                return
            msg = parse_client_message(raw)
            if msg["type"] in UTTERANCE_MESSAGES:
                self.speech.handle_message(msg)
            elif msg["type"] == "interrupt":
                self.interrupt()
            elif msg["type"] == "ping":
                reply(message("pong", t=msg.get("t")))
        except RealtimeError as exc:
            reply(message("error", message=str(exc)))

    def _send_unsent(self) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            while self._unsent:
                self._send(self._unsent.pop(0))

    def _send(self, text: str) -> None:
        """An event for the peer: on its data channel and to every listener."""
        self._send_channel(text)
        for listener in list(self.listeners):
            listener(text)

    def _send_channel(self, text: str) -> None:
        """Send on the data channel; until it is open, the first few wait for it (the
        pre-roll's `delay_grown` is decided as the first audio arrives)."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            if len(self._unsent) < 32:
                self._unsent.append(text)
            return
        try:
            while self._unsent:
                channel.send(self._unsent.pop(0))
            channel.send(text)
        except Exception:
            log.exception("session %s: data channel send failed", self.id)

    def stats(self) -> dict:
        """Playout counters and latencies so far (also sent to the peer as `stats`)."""
        sent, fresh = self.video.sent, self.video.sent - self.video.repeated
        due = sent + self.video.missed  # a skipped deadline is a frame the viewer never got
        lips = sorted(self.speech_to_lips)

        def ms(x: float | None) -> int | None:
            return None if x is None else round(x * 1000)

        return {
            "frames_sent": sent,
            "frames_fresh": fresh,
            "frames_repeated": self.video.repeated,
            "frames_dropped": self.video.dropped,
            "frames_missed": self.video.missed,
            "frames_generated": self.generated,
            "frames_skipped": self.worker.skipped_frames_total,
            "frames_queued": self.frames.depth(),  # made, not yet due
            "fresh_share": round(fresh / due, 4) if due else None,
            "ttff_ms": ms(self.ttff_s),
            "playout_delay_ms": ms(self.playout_delay_s),
            "playout_delay_now_ms": ms(
                None
                if self.playout_delay_s is None
                else self.playout_delay_s + self.playout.grown_s
            ),
            "preroll_ms": ms(self.playout.preroll_s),
            "speech_to_lips_p50_ms": ms(lips[len(lips) // 2]) if lips else None,
            "speech_to_lips_p95_ms": ms(lips[int(len(lips) * 0.95)]) if lips else None,
            "step_seconds": round(self.worker.step_seconds, 4),
            "first_step_ms": ms(self.first_step_s),
            **self.speech.describe(),
        }

    def describe(self) -> dict:
        return {
            "id": self.id,
            "state": self.state,
            "age_s": round(time.time() - self.created, 1),
            **self.stats(),
            "queue_depth": self.frames.depth(),
            "speaking": self.vad.speaking,
        }
