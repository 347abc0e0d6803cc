"""One peer: a short chain of parts, each owning its state and its cleanup.

    audio in          AudioIn (realtime.audio_in): microphone and utterances → timeline,
                      16 kHz → VAD thread and engine feed
    engine feed       EngineFeed (realtime.engine_feed): the engine thread → FrameQueue
    playout           PlayoutControl (realtime.playout): the delay's budget, its clock
                      and control loop
    outgoing tracks   OutgoingTracks (realtime.tracks): paced A/V on that clock, sinks
    control channel   ControlChannel (realtime.control): events out, the data channel,
                      playback events, the agent's utterances
    peer connection   PeerLink (realtime.connection): aiortc's connection, freed at close

What they share lives below them all (`realtime.buffers`): the `PlaybackTimeline` (audio
in → audio track), the `FrameQueue` (engine feed → video track) and the `PlayoutClock`
(started by playout, read by the tracks and the engine feed). So the parts import each
other one way only: audio in → the engine feed and the tracks → playout → control.

Each part is given the parts it needs, explicitly; a part reaches the session only to end
it (`close`, `_fail`) or to pass it an interrupt (`interrupt`, `_splice`). An interrupt is
one `Interrupt` message through the parts in chain order, each doing its own flush.
Closing the session stops the parts (no more input, generation, media), then closes them
in order, each waiting for its own threads and tasks and dropping what ties it to the
others, so a closed call is freed at once.

Silence is part of the timeline: if the peer stops sending, digital silence is padded so
the avatar keeps moving (idle). A peer that sends nothing for `peer_timeout_s` is treated
as gone and the session closes. Playout follows the latency budget (`realtime.playout`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from pipeline.clock import FPS, MODEL_RATE
from pipeline.stream import AvatarStream
from realtime.audio_in import AudioIn
from realtime.buffers import FrameQueue, PlaybackTimeline
from realtime.connection import PeerLink
from realtime.control import ControlChannel, Interrupt
from realtime.engine_feed import EngineFeed
from realtime.engine_timing import EngineTiming
from realtime.errors import RealtimeError, SessionClosed
from realtime.events import message, parse_client_message
from realtime.generation import GenerationWorker
from realtime.metrics import RealtimeMetrics
from realtime.playout import PlayoutBudget, PlayoutControl
from realtime.session_config import SessionConfig
from realtime.stagger import StepCycle
from realtime.tracks import (
    AvatarAudioTrack,
    AvatarVideoTrack,
    MediaSink,
    OutgoingTracks,
    ms,
)
from realtime.utterance import UTTERANCE_MESSAGES, UtteranceChannel
from realtime.vad import VoiceActivityDetector

log = logging.getLogger(__name__)


class Part(Protocol):
    """What the session asks of each of its parts, in order: stop taking work, then close
    (wait for its own threads and tasks, drop what ties it to the other parts)."""

    def stop(self) -> None: ...

    async def close(self) -> None: ...


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
        cycle: StepCycle | None = None,
    ) -> None:
        """`cycle`: the calls sharing the engine, among which this one places its steps
        (`realtime.stagger`; None: it plans on `timing` alone)."""
        self.id = session_id
        self.pc = pc
        self.video_size = video_size  # (width, height)
        self.offer_options: dict[str, Any] = {}  # what the peer asked for (e.g. kvs_stream)
        self.config = config
        self.metrics = metrics
        self.created = time.time()
        self.state = "new"  # new → live → closed
        self.close_reason = ""
        # (frame due at the interrupt, first re-timed frame, first frame of new audio)
        self.last_interrupt: tuple[int, int, int] | None = None
        self._on_closed = on_closed
        self._closing: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None

        # The two buffers between the parts: audio in → audio track, engine feed → video track.
        timeline = PlaybackTimeline(config.max_input_ahead_s)
        lead = max(1, int(config.lead_s * FPS))
        frames = FrameQueue(lead, capacity=lead + 10 * FPS)
        # Built so that each part gets the ones it needs. Three needs point at parts built
        # later (utterance audio → audio in; held audio and silence → audio in; the measured
        # step → playout): small lambdas, dropped by the part's close like every callback.
        control = self.control = ControlChannel(
            session_id,
            metrics,
            config.utterance_idle_s,
            push=lambda pcm48, placed: audio_in.push(pcm48, placed),
            interrupt=self.interrupt,
            splice=self._splice,
        )
        playout = self.playout = PlayoutControl(
            timing,
            frames,
            metrics,
            control.send,
            ingest=lambda pcm48, arrived: audio_in.ingest(pcm48, arrived),
            step_seconds=lambda: feed.worker.measured_step_seconds,
            margin_s=config.playout_margin_s,
            fixed_delay_s=config.playout_delay_s,
            interrupt_tail_s=config.interrupt_tail_s,
            session_id=session_id,
            cycle=cycle,
            engine_shift=lambda: feed.worker.skipped / MODEL_RATE,
            agent_speech=lambda: control.speech.active,
        )
        feed = self.feed = EngineFeed(
            session_id,
            lambda: open_engine_stream(config.seed),
            frames,
            playout,
            metrics,
            self._fail,
            config.playout_margin_s,
            engine_lock,
        )
        tracks = self.tracks = OutgoingTracks(
            session_id, playout, frames, timeline, control, video_size, metrics
        )
        audio_in = self.audio_in = AudioIn(
            session_id, config, timeline, vad, feed, playout, control, tracks, metrics, self._end
        )
        self.link = PeerLink(session_id, pc)
        # the order parts are stopped and closed in: input, the peer connection (hung up
        # before waiting for the engine's step), generation, media's sinks, the rest
        self._parts: tuple[Part, ...] = (audio_in, self.link, feed, tracks, playout, control)
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start generation (after the answer is set); media flows once audio arrives."""
        if self.state != "new":
            raise SessionClosed(f"session {self.id} is {self.state}, cannot start")
        self.state = "live"
        self.feed.start()
        self._watchdog = asyncio.get_running_loop().create_task(
            self._tick(), name=f"watchdog-{self.id[:8]}"
        )
        if not self.link.receives_audio():
            self.audio_in.start_without_microphone()

    def close(self, reason: str = "closed") -> asyncio.Task:
        """Close once (idempotent); returns the task doing it so callers may await it."""
        if self._closing is None:
            self.close_reason = reason
            self._closing = asyncio.get_running_loop().create_task(self._close())
        return self._closing

    async def _close(self) -> None:
        log.info("session %s: closing (%s)", self.id, self.close_reason)
        self.state = "closed"
        # Dropped, not kept: a cancelled task holds its traceback, and so this session.
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        # first, so that a listener has it before the tracks end (its cue to finish)
        self.control.send(message("session_closed", reason=self.close_reason))
        for part in self._parts:  # no more input, generation or media
            self._guard(part.stop, part)
        try:
            for part in self._parts:
                try:
                    await part.close()
                except Exception:
                    log.exception("session %s: closing %s failed", self.id, type(part).__name__)
        finally:
            if watchdog is not None:
                await asyncio.gather(watchdog, return_exceptions=True)
            await self._on_closed(self)

    def _guard(self, fn: Callable[[], object], part: object) -> None:
        try:
            fn()
        except Exception:
            log.exception("session %s: stopping %s failed", self.id, type(part).__name__)

    def _end(self, reason: str, error: BaseException | None = None) -> None:
        """A part ends the session: its input ended (`reason`), or it failed (`error`)."""
        if error is not None:
            self._fail(error)
        else:
            self.close(reason)

    def _fail(self, exc: BaseException) -> None:
        self.metrics.session_errors.inc()
        self.control.send(message("error", message=f"{type(exc).__name__}: {exc}"))
        self.close(f"error: {type(exc).__name__}")

    async def _tick(self) -> None:
        """The session's control loop, every 0.1 s: stats to the peer once a second; the
        playout delay planned and grown; idle utterances ended; a vanished peer ends the
        session; silence keeps the timeline moving while the peer is quiet."""
        ticks = 0
        while True:
            await asyncio.sleep(0.1)
            ticks += 1
            if ticks % 10 == 0:
                self.control.send(message("stats", **self.stats()))
            audio_in = self.audio_in
            self.playout.tick()
            self.playout.grow(audio_in.timeline.head, audio_in.last_rx, audio_in.quiet())
            self.control.speech.tick(time.monotonic())
            gone = audio_in.gone()
            if gone is not None:
                self.close(gone)
                return
            audio_in.fill()

    # ---- the peer connection's events ------------------------------------------------

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.close(f"connection {self.pc.connectionState}")

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self.audio_in.receive(track)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        control = self.control
        control.attach(channel, lambda raw: self.handle_message(raw, control.send_channel))

    # ---- agent control ---------------------------------------------------------------

    def handle_message(self, raw: str | bytes, reply: Callable[[str], None]) -> None:
        """One message from the peer (data channel, or the WebSocket `/speech`); a bad one
        is answered with an `error` through `reply`, and the session goes on."""
        try:
            if self.state != "live":
                raise SessionClosed(f"session {self.id} is {self.state}")
            if isinstance(raw, bytes | bytearray):
                self.control.speech.handle_audio(raw)
                return
            msg = parse_client_message(raw)
            if msg["type"] in UTTERANCE_MESSAGES:
                self.control.speech.handle_message(msg)
            elif msg["type"] == "interrupt":
                self.interrupt()
            elif msg["type"] == "ping":
                reply(message("pong", t=msg.get("t")))
        except RealtimeError as exc:
            reply(message("error", message=str(exc)))

    def interrupt(self) -> int:
        """Flush queued speech: its sound stops at once; generated frames beyond one chunk
        (`interrupt_tail_s`) are dropped, so lips stop after that chunk plus the audio the
        engine already holds, and the video never freezes. New input (or idle) follows, in
        sync. Returns the ms of the current speech segment (or utterance) that were played."""
        if self.state != "live":
            raise SessionClosed(f"session {self.id} is {self.state}; cannot interrupt")
        return self._pass(Interrupt(self.tracks.audio.position)).played_ms

    def _splice(self) -> None:
        """An utterance begins while the avatar idles: the idle audio queued ahead of
        playout (a whole playout delay of it) is dropped as an interrupt drops speech, so
        the utterance is said one chunk from now instead of after that queue."""
        if self.state == "live" and self.playout.clock.t0 is not None:
            if not self.audio_in.vad.speaking:
                self._pass(Interrupt(self.tracks.audio.position, splice=True))
                self.audio_in.top_up()

    def _pass(self, cut: Interrupt) -> Interrupt:
        """The one interrupt path: what is being said ends (control), the frame due now
        (playout), frames and the engine's input cut (engine feed), the timeline and VAD
        (audio in), speech-to-lips (tracks); then the peer is told (control)."""
        for part in (self.control, self.playout, self.feed, self.audio_in, self.tracks):
            part.interrupt(cut)
        self.last_interrupt = (cut.now, cut.cut, cut.new_audio)
        self.control.interrupted(cut)
        return cut

    # ---- what the server, its routes and tests read ----------------------------------

    @property
    def video(self) -> AvatarVideoTrack:
        return self.tracks.video

    @property
    def audio(self) -> AvatarAudioTrack:
        return self.tracks.audio

    @property
    def sinks(self) -> list[MediaSink]:
        return self.tracks.sinks  # attach mirrors here before media flows

    @property
    def listeners(self) -> list[Callable[[str], None]]:
        return self.control.listeners  # more event receivers (WebSockets, Pipecat)

    @property
    def speech(self) -> UtteranceChannel:
        return self.control.speech

    @property
    def frames(self) -> FrameQueue:
        return self.feed.frames

    @property
    def worker(self) -> GenerationWorker:
        return self.feed.worker

    @property
    def generated(self) -> int:
        return self.feed.generated

    @property
    def ttff_s(self) -> float | None:
        return self.tracks.ttff_s

    @property
    def tasks(self) -> set[asyncio.Task]:
        own = {self._watchdog} if self._watchdog is not None else set()
        return own | self.audio_in.tasks

    @property
    def budget(self) -> PlayoutBudget | None:
        return self.playout.budget

    @property
    def playout_delay_s(self) -> float | None:
        return self.playout.delay_s

    def stats(self) -> dict:
        """Playout counters and latencies so far (also sent to the peer as `stats`)."""
        delay, playout = self.playout_delay_s, self.playout
        return {
            **self.tracks.stats(),
            **self.feed.stats(),
            "playout_delay_ms": ms(delay),
            "playout_delay_now_ms": ms(None if delay is None else delay + playout.grown_s),
            "preroll_ms": ms(playout.preroll_s),
            "step_seconds": round(self.feed.step_seconds, 4),
            # the step its delay is planned on: its own and its wait for the others' where
            # it takes turns with them (`realtime.stagger`), else the step of all of them
            "planned_step_ms": ms(playout.timing.steady_seconds),
            "first_step_ms": ms(self.feed.first_step_s),
            **self.control.speech.describe(),
        }

    def describe(self) -> dict:
        return {
            "id": self.id,
            "state": self.state,
            "age_s": round(time.time() - self.created, 1),
            **self.stats(),
            "queue_depth": self.frames.depth(),
            "speaking": self.audio_in.vad.speaking,
        }
