"""Incoming audio: decoded WebRTC frames → one open-ended timeline at 48 kHz and 16 kHz.

aiortc hands us Opus decoded to 48 kHz stereo s16. PyAV's `AudioResampler` (libswresample)
downmixes it to mono 48 kHz, which is kept for playout (the avatar says back what it heard),
and a second resampler derives mono 16 kHz float32 for silero-vad and the engine. Padding
silence goes through the same path, so both rates always describe the same timeline.

Positions are sample indices on the 48 kHz timeline (`pos48`); the 16 kHz stream lags it
by the resampler's filter delay, a few samples.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.clock import (
    MODEL_RATE,
    MODEL_SAMPLES_PER_FRAME,
    OUTPUT_RATE,
    OUTPUT_SAMPLES_PER_FRAME,
    OUTPUT_SAMPLES_PER_MODEL_SAMPLE,
)
from realtime.buffers import PlaybackTimeline
from realtime.events import message
from realtime.vad import VadEvent, VadThread, VoiceActivityDetector

if TYPE_CHECKING:
    from realtime.control import ControlChannel, Interrupt
    from realtime.engine_feed import EngineFeed
    from realtime.metrics import RealtimeMetrics
    from realtime.playout import PlayoutControl
    from realtime.session_config import SessionConfig
    from realtime.tracks import OutgoingTracks

log = logging.getLogger(__name__)


class InputResampler:
    """Decoded frames (any rate/layout/format) → mono s16 48 kHz and mono float32 16 kHz."""

    def __init__(self) -> None:
        self._to48 = av.AudioResampler(format="s16", layout="mono", rate=OUTPUT_RATE)
        self._to16 = av.AudioResampler(format="flt", layout="mono", rate=MODEL_RATE)

    def mono48(self, frame: av.AudioFrame) -> np.ndarray:
        """Downmix/resample one decoded frame; int16 (n,) at 48 kHz."""
        frame.pts = None  # our timeline is sample counts, not the peer's RTP clock
        return _concat_s16(self._to48.resample(frame))

    def to16(self, pcm48: np.ndarray) -> np.ndarray:
        """Mono int16 48 kHz → mono float32 16 kHz, finite and within [-1, 1]."""
        if pcm48.size == 0:
            return np.zeros(0, np.float32)
        frame = av.AudioFrame.from_ndarray(pcm48.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUTPUT_RATE
        out = [f.to_ndarray().reshape(-1) for f in self._to16.resample(frame)]
        pcm16 = np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)
        # s16 input cannot carry NaN, but a misbehaving filter must never reach the model.
        return np.clip(np.nan_to_num(pcm16, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)


def _concat_s16(frames: list[av.AudioFrame]) -> np.ndarray:
    if not frames:
        return np.zeros(0, np.int16)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)


class AudioIn:
    """A session's input part: the peer's audio onto one timeline, heard by the VAD and fed
    to the engine.

    Two sources write the timeline: the microphone track (decoded, downmixed, resampled
    here) and the agent's utterances (`push`, from the control channel). Until the playout
    delay is planned their audio is held by `PlayoutControl.probe`; then `ingest` appends it
    at 48 kHz for playout, and hands the same samples at 16 kHz to the VAD thread and to the
    engine feed. Silence is part of the timeline: if the peer stops sending, `fill` pads
    digital silence so the avatar keeps moving (idle).
    """

    def __init__(
        self,
        session_id: str,
        config: SessionConfig,
        timeline: PlaybackTimeline,
        detector: VoiceActivityDetector,
        feed: EngineFeed,
        playout: PlayoutControl,
        control: ControlChannel,
        tracks: OutgoingTracks,
        metrics: RealtimeMetrics,
        end: Callable[[str, BaseException | None], object],
    ) -> None:
        """`end(reason, error)` closes the session: the peer ended its track, or it failed."""
        self._sid = session_id
        self._config = config
        self._feed = feed
        self._playout = playout
        self._control = control
        self._tracks = tracks
        self._metrics = metrics
        self._end = end
        self.created = time.time()
        self.timeline = timeline
        self._resampler = InputResampler()
        self.vad = VadThread(
            detector, asyncio.get_running_loop(), self._on_vad, name=f"vad-{session_id[:8]}"
        )
        self.last_rx: float | None = None  # the timeline's input (microphone or utterances)
        self._last_mic: float | None = None  # the microphone track: is the peer there?
        self._last_speech_start = 0.0
        self._overfull_logged = False
        self._tasks: set[asyncio.Task] = set()
        self._stopped = False

    @property
    def tasks(self) -> set[asyncio.Task]:
        return set(self._tasks)

    # ---- sources -----------------------------------------------------------------------

    def receive(self, track: MediaStreamTrack) -> None:
        """Read the peer's microphone track until it ends (a task this part owns)."""
        task = asyncio.get_running_loop().create_task(
            self._receive(track), name=f"audio-in-{self._sid[:8]}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _receive(self, track: MediaStreamTrack) -> None:
        speech = self._control.speech
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame), "an audio track yields audio frames"
                self._last_mic = time.monotonic()
                if speech.active:
                    continue  # utterances feed the timeline now; the mic says "still here"
                self._arrive(self._resampler.mono48(frame), self._last_mic, _ignore)
        except MediaStreamError:
            self._end("peer ended its audio track", None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: audio input failed", self._sid)
            self._end(f"error: {type(exc).__name__}", exc)

    def push(self, pcm48: np.ndarray, placed: Callable[[int | None], None]) -> None:
        """Utterance audio (`realtime.utterance`) joins the timeline as a microphone's would;
        `placed` gets its timeline position once it is there (None if refused)."""
        self._arrive(pcm48, time.monotonic(), placed)

    def _arrive(self, pcm48: np.ndarray, at: float, placed: Callable[[int | None], None]) -> None:
        self.last_rx = at
        playout = self._playout
        if playout.first_audio is None:
            playout.first_audio = at
        if playout.planned is None:
            playout.probe(pcm48, at, playout.first_audio, placed)
        else:
            placed(self.ingest(pcm48, at))

    def start_without_microphone(self) -> None:
        """No microphone (an agent speaking only through utterances): the avatar idles from
        now on, as after a microphone's silent first audio."""
        self._playout.first_audio = self.last_rx = time.monotonic()
        self._playout.decide_start(self._playout.first_audio)

    # ---- the timeline ------------------------------------------------------------------

    def ingest(self, pcm48: np.ndarray, arrived: float | None = None) -> int | None:
        """Append to the timeline; VAD and the engine see the same audio. `arrived` is the
        peer audio's arrival time (None for silence the session inserts). Returns the
        position of the first sample, None when the buffer is full and it was dropped."""
        if self.timeline.overfull():
            if not self._overfull_logged:  # once per episode, not 50 times a second
                self._overfull_logged = True
                log.warning(
                    "session %s: input is %.0f s ahead of playout, dropping audio",
                    self._sid,
                    self._config.max_input_ahead_s,
                )
            return None
        self._overfull_logged = False
        at = self.timeline.append(pcm48)
        self._tracks.arrived(self.timeline.head, arrived)
        pcm16 = self._resampler.to16(pcm48)
        self.vad.feed(pcm16)
        self._feed.push(pcm16)
        if arrived is None:
            self._control.speech.silence_inserted(at, pcm48.size)
        return at

    def _on_vad(self, event: VadEvent) -> None:
        if self._stopped:  # an event the VAD thread sent before it was closed
            return
        self._metrics.vad_transitions.labels(event.kind).inc()
        at48 = event.sample * OUTPUT_SAMPLES_PER_MODEL_SAMPLE
        # Playbacks are VAD segments of a microphone; an agent's utterances say their own.
        segments = not self._control.speech.active
        if event.kind == "speech_started":
            self._last_speech_start = time.monotonic()
            if segments:
                self._control.playback.speech_started(at48)
        else:
            if segments:
                self._control.playback.speech_stopped(at48)
            self._playout.replan()  # between utterances: the only time the delay may change
        self._control.send(message(event.kind, at_ms=round(event.ms)))

    def quiet(self) -> bool:
        """Nobody speaks: no speech, no utterance open, and no speech start that may still be
        on its way from the VAD thread (the playout delay grows only then)."""
        return (
            not self.vad.speaking
            and self._control.speech.open is None
            and time.monotonic() - self._last_speech_start >= 0.5
        )

    # ---- the control loop's share --------------------------------------------------------

    def gone(self) -> str | None:
        """Why the peer counts as gone (the session then closes), or None."""
        timeout = self._config.peer_timeout_s
        if self._last_mic is not None and time.monotonic() - self._last_mic > timeout:
            return f"no audio from the peer for {timeout:.0f} s"
        if self._playout.first_audio is None and time.time() - self.created > timeout + 10:
            return "the peer never sent audio"
        return None

    def fill(self) -> None:
        """Keep the timeline moving: pad silence when the peer went quiet or its clock
        runs slow, or (an utterance arriving) when playout would run out of audio."""
        first_audio, cfg = self._playout.first_audio, self._config
        if first_audio is None:
            return
        if self._control.speech.open is not None:
            self._fill_utterance()
            return
        elapsed = time.monotonic() - first_audio + self._playout.inserted_s
        behind = elapsed - self.timeline.head / OUTPUT_RATE
        last = None if self.last_rx is None else time.monotonic() - self.last_rx
        quiet = (last or 0.0) > cfg.fill_after_s
        if (quiet and behind > cfg.fill_margin_s) or behind > cfg.fill_drift_s:
            pad = int((behind - cfg.fill_margin_s) * OUTPUT_RATE)
            self.ingest(np.zeros(pad, np.int16))

    def _fill_utterance(self) -> None:
        """While an utterance arrives, silence goes into it only if its stream stalled and
        playout would otherwise run out of audio (a TTS slower than real time); the
        utterance does not count it."""
        t0, utt = self._playout.clock.t0, self._control.speech.open
        if t0 is None or utt is None:
            return
        if time.monotonic() - utt.last_data < self._config.fill_after_s:
            return
        need = self._config.interrupt_tail_s + 2 * self._feed.step_seconds
        lead = self.timeline.head / OUTPUT_RATE - (time.monotonic() - t0)
        if lead < need:
            self.ingest(np.zeros(int((need - lead) * OUTPUT_RATE), np.int16))

    def top_up(self) -> None:
        """After a splice: a slow engine could not make the utterance's first frames by the
        time they are due (the worker would skip speech), so a little more idle goes first."""
        ready = self._playout.clock.frame_now() + math.ceil(self._feed.worker.frames_ahead_needed())
        short = ready * OUTPUT_SAMPLES_PER_FRAME - self.timeline.head
        if short > 0:
            self.ingest(np.zeros(short, np.int16))

    # ---- interrupt and close -----------------------------------------------------------

    def interrupt(self, cut: Interrupt) -> None:
        """Queued input from the cut on is dropped: the timeline's head moves to where new
        audio starts, what lies between the played position and it is muted, and the VAD
        goes on from there with fresh state (a running speech segment ends)."""
        new_audio48 = cut.new_audio * OUTPUT_SAMPLES_PER_FRAME
        self.timeline.cut_at(new_audio48)
        cut.head = self.timeline.head
        self.timeline.mute(cut.position, new_audio48)
        stop = self.vad.reset_at(cut.new_audio * MODEL_SAMPLES_PER_FRAME)
        if stop is not None:
            self._metrics.vad_transitions.labels(stop.kind).inc()
            self._control.send(message(stop.kind, at_ms=round(stop.ms), interrupted=True))

    def stop(self) -> None:
        """Take no more input: the microphone's reader is cancelled, the VAD thread ends."""
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()
        self.vad.close()

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._end = _ignore


def _ignore(*args: object) -> None:
    pass
