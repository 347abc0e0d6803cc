"""The utterance audio channel: an agent's speech, pushed as fast as its TTS makes it.

Beside the microphone track, an agent may send its audio as utterances: one stream per
utterance, declared, sent faster than real time, ended explicitly. The same messages travel
on the session's WebRTC data channel and on the WebSocket `/sessions/{id}/speech`:

    peer → server
      {"type": "utterance_start", "id": "u1", "sample_rate": 24000, "num_channels": 1}
      binary message: int16 little-endian PCM, channels interleaved, whole sample frames,
                      at most MAX_CHUNK_BYTES; it belongs to the open utterance
      {"type": "utterance_end", "id": "u1"}
      {"type": "clear_buffer"}            drop everything not yet played (barge-in); with
      {"type": "clear_buffer", "id": "u1"}  an id, only if u1 has not finished yet
    server → peer
      {"type": "playback_started", "id": "u1", "at_sample": N}
      {"type": "playback_finished", "id": "u1", "playback_position": 1.24,
       "interrupted": false, "at_sample": N}
      {"type": "error", "message": "...", "id": "u1"}       (id where one is concerned)

`playback_position` is in seconds of the utterance that the viewer was actually sent (the
avatar's audio and the video frames made from it leave together), not what was received.
Every utterance gets exactly one `playback_finished`; one cleared before any of it was
shown gets `{playback_position: 0, interrupted: true}` and no `playback_started`.
`at_sample` is the position on the session's 48 kHz output timeline (the avatar audio
track's RTP clock, from its first packet), so a client can tell which returned audio and
video belong to the utterance.

These are LiveKit Agents' avatar data-stream semantics: `utterance_start` … binary …
`utterance_end` is one `lk.audio_stream` byte stream (its `sample_rate` / `num_channels`
attributes, its chunks, its close), `clear_buffer` is the `lk.clear_buffer` RPC, and
`playback_started` / `playback_finished {playback_position, interrupted}` are the
`lk.playback_started` / `lk.playback_finished` RPCs the avatar calls back. As there, a
stream whose end never comes is ended after `idle_timeout_s` without data (with an error).

The audio joins the session's one timeline (`realtime.session`): once a session has had an
utterance, its input is the channel, and a microphone track it may also have only tells
that the peer is still there.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import av
import numpy as np

from pipeline.clock import OUTPUT_RATE
from realtime.errors import BadRequest

MAX_CHUNK_BYTES = 64 * 1024  # one binary message (an SCTP message stays well under aiortc's limit)
MAX_RATE = 192_000
MAX_CHANNELS = 8
MAX_QUEUED = 64  # utterances started and not yet finished
MAX_ID = 128
UTTERANCE_MESSAGES = ("utterance_start", "utterance_end", "clear_buffer")
log = logging.getLogger(__name__)


def message(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


@dataclass
class Utterance:
    id: str
    rate: int
    channels: int
    last_data: float  # monotonic time of its last message
    resampler: av.AudioResampler | None = None
    start: int | None = None  # timeline position (48 kHz) of its first sample
    end: int = 0  # one past its last sample placed on the timeline
    unplaced: int = 0  # parts handed to the session, not yet on the timeline
    received: int = 0  # input sample frames
    ended: bool = False  # its end arrived (or it timed out)
    started: bool = False  # playback_started sent
    finished: bool = False  # playback_finished sent
    dropped: int = 0  # 48 kHz samples the full timeline refused
    gaps: list[tuple[int, int]] = field(default_factory=list)  # silence the session put in

    def said(self, upto: int) -> int:
        """Samples of its own audio on the timeline before `upto` (its gaps not counted)."""
        if self.start is None:
            return 0
        upto = min(upto, self.end)
        inserted = sum(max(0, min(at + n, upto) - at) for at, n in self.gaps if at < upto)
        return max(0, upto - self.start - inserted)


@dataclass
class UtteranceChannel:
    """One session's utterances: their audio onto the timeline, their playback events.

    `push(pcm48, placed)` hands mono 48 kHz int16 audio to the session, which calls
    `placed(position | None)` once it is on the timeline (None: refused, the buffer is full);
    `interrupt()` is the session's flush (it calls `cut` back with the playout position),
    `splice()` lets it bring a new utterance forward over queued idle audio;
    `emit` sends a message to the peer. `played` is called by the audio track as it sends.
    """

    push: Callable[[np.ndarray, Callable[[int | None], None]], None]
    interrupt: Callable[[], object]
    emit: Callable[[str], None]
    idle_timeout_s: float = 10.0
    # called before the first audio of an utterance that nothing is queued ahead of: the
    # session may drop its queued idle audio so that the utterance is said sooner
    splice: Callable[[], None] = lambda: None
    on_finished: Callable[[bool], None] = lambda interrupted: None  # metrics
    queue: deque[Utterance] = field(default_factory=deque)  # not yet finished, in order
    open: Utterance | None = None  # receiving audio
    finished_ids: deque[str] = field(default_factory=lambda: deque(maxlen=256))
    position: int = 0  # timeline samples the audio track has sent
    active: bool = False  # the channel feeds the timeline (set by the first utterance)

    def detach(self) -> None:
        """The session closed: drop its callbacks (they hold it: a reference cycle that
        would keep the closed call in memory until a full garbage collection)."""
        self.push = lambda pcm48, placed: placed(None)
        self.interrupt = lambda: None
        self.emit = lambda text: None
        self.splice = lambda: None
        self.on_finished = lambda interrupted: None
        self.queue.clear()
        self.open = None

    # ---- from the peer ---------------------------------------------------------------

    def handle_message(self, msg: dict) -> None:
        """A parsed JSON message of one of UTTERANCE_MESSAGES; BadRequest says what was
        wrong (the transport sends it back as an `error`; the session goes on)."""
        kind = msg.get("type")
        if kind == "utterance_start":
            self._start(msg)
        elif kind == "utterance_end":
            self._end(self._id(msg))
        elif kind == "clear_buffer":
            self.clear(self._id(msg) if "id" in msg else None)
        else:
            raise BadRequest(f"not an utterance message: {kind!r}")

    def handle_audio(self, data: bytes | bytearray) -> None:
        """A binary message: PCM of the open utterance."""
        self._audio(bytes(data))

    def _id(self, msg: dict) -> str:
        uid = msg.get("id")
        if not isinstance(uid, str) or not 0 < len(uid) <= MAX_ID:
            raise BadRequest(f"'id' must be a string of 1-{MAX_ID} characters")
        return uid

    def _start(self, msg: dict) -> None:
        uid = self._id(msg)
        rate, channels = msg.get("sample_rate"), msg.get("num_channels", 1)
        if not isinstance(rate, int) or isinstance(rate, bool) or not 0 < rate <= MAX_RATE:
            raise BadRequest(
                f"utterance {uid!r}: 'sample_rate' must be an integer in [1, {MAX_RATE}] Hz "
                f"(got {rate!r}); declare the rate of the PCM you will send"
            )
        if not isinstance(channels, int) or not 0 < channels <= MAX_CHANNELS:
            raise BadRequest(
                f"utterance {uid!r}: 'num_channels' must be an integer in [1, {MAX_CHANNELS}]"
            )
        if self.open is not None and self.open.finished:
            self._close_open()  # cleared while open: a new utterance supersedes it
        if self.open is not None:
            raise BadRequest(
                f"utterance {self.open.id!r} is still open: end it (utterance_end) before "
                f"starting {uid!r}"
            )
        if any(u.id == uid for u in self.queue) or uid in self.finished_ids:
            raise BadRequest(f"utterance id {uid!r} was used already: give each one its own")
        if len(self.queue) >= MAX_QUEUED:
            raise BadRequest(
                f"{MAX_QUEUED} utterances are queued and unplayed: wait for playback_finished"
            )
        resampler = av.AudioResampler(format="s16", layout="mono", rate=OUTPUT_RATE)
        self.open = Utterance(uid, rate, channels, time.monotonic(), resampler)
        self.queue.append(self.open)
        self.active = True

    def _audio(self, data: bytes) -> None:
        utt = self.open
        if utt is None:
            raise BadRequest(
                "binary audio but no open utterance: send utterance_start with its "
                "sample_rate and num_channels first"
            )
        frame_bytes = 2 * utt.channels
        if not data or len(data) > MAX_CHUNK_BYTES or len(data) % frame_bytes:
            raise BadRequest(
                f"utterance {utt.id!r}: a PCM message must be 1-{MAX_CHUNK_BYTES} bytes of "
                f"whole int16 frames of {utt.channels} channel(s) ({frame_bytes} bytes each); "
                f"got {len(data)} bytes"
            )
        utt.last_data = time.monotonic()
        if utt.finished:  # cleared while it was still arriving: the rest is not said
            return
        pcm = np.frombuffer(data, "<i2").reshape(-1, utt.channels)
        utt.received += pcm.shape[0]
        mono = pcm[:, 0] if utt.channels == 1 else pcm.mean(axis=1).astype(np.int16)
        self._place(utt, _resample(utt, mono))

    def _end(self, uid: str) -> None:
        utt = self.open
        if utt is None or utt.id != uid:
            where = f"the open one is {utt.id!r}" if utt else "none is open"
            raise BadRequest(f"utterance_end for {uid!r}, but {where}")
        self._close_open()

    def _close_open(self) -> None:
        utt = self.open
        assert utt is not None
        self.open = None
        if not utt.finished:
            self._place(utt, _resample(utt, None))  # the resampler's last samples
        utt.ended = True
        utt.resampler = None
        self._advance()

    def clear(self, uid: str | None = None) -> None:
        """Barge-in: everything not yet played is dropped (`lk.clear_buffer`). With an id,
        only if that utterance has not finished (a late clear must not cut the next one)."""
        if uid is not None and not any(u.id == uid for u in self.queue):
            state = "already finished" if uid in self.finished_ids else "unknown"
            raise BadRequest(f"clear_buffer for utterance {uid!r}: it is {state}")
        self.interrupt()

    def transport_closed(self) -> None:
        """The socket that carried the open utterance is gone: end it where it got to."""
        if self.open is not None:
            self.emit(
                message(
                    "error",
                    id=self.open.id,
                    message=f"utterance {self.open.id!r}: its connection closed before "
                    "utterance_end; ended it",
                )
            )
            self._close_open()

    # ---- from the session ------------------------------------------------------------

    def _place(self, utt: Utterance, pcm48: np.ndarray) -> None:
        if not pcm48.size:
            return
        if utt.start is None and utt.unplaced == 0 and self.queue and self.queue[0] is utt:
            self.splice()  # nothing of another utterance is left to say before it
        utt.unplaced += 1

        def placed(at: int | None) -> None:
            utt.unplaced -= 1
            if at is None:
                utt.dropped += pcm48.size
            elif utt.start is None:
                utt.start, utt.end = at, at + pcm48.size
            else:
                utt.end = at + pcm48.size
            if at is None and utt.dropped == pcm48.size:  # the first refusal, once
                self.emit(
                    message(
                        "error",
                        id=utt.id,
                        message=f"utterance {utt.id!r}: the buffer is full (audio is far "
                        "ahead of playout); audio was dropped: send slower",
                    )
                )
            self._advance()

        self.push(pcm48, placed)

    def played(self, position: int) -> None:
        """The audio track sent timeline samples up to `position`."""
        self.position = position
        self._advance()

    def cut(self, position: int) -> int:
        """The session flushes at playout `position`: every utterance still queued ends,
        interrupted, with what was played of it. Returns the ms played of the one that
        was being said (0 if none)."""
        self.position = position
        current = 0
        for utt in list(self.queue):
            played = utt.said(position) if utt.started else 0
            current = max(current, played)
            self._finish(utt, played, interrupted=True)
        self.queue.clear()
        return round(current * 1000 / OUTPUT_RATE)

    def silence_inserted(self, at: int, samples: int) -> None:
        """The session put silence on the timeline at `at` (playout would have run dry)."""
        utt = self.open
        if utt is not None and utt.start is not None and samples:
            utt.gaps.append((at, samples))

    def tick(self, now: float) -> None:
        """Called about every 0.1 s: end an open utterance whose stream went quiet."""
        utt = self.open
        if utt is not None and now - utt.last_data > self.idle_timeout_s:
            self.emit(
                message(
                    "error",
                    id=utt.id,
                    message=f"utterance {utt.id!r} got no audio and no utterance_end for "
                    f"{self.idle_timeout_s:g} s: ended it (send utterance_end after the last "
                    "chunk)",
                )
            )
            self._close_open()

    def _advance(self) -> None:
        """Send the playback events the playout position has reached, in order."""
        while self.queue:
            utt = self.queue[0]
            if utt.finished:
                self.queue.popleft()
                continue
            if not utt.started and utt.start is not None and self.position > utt.start:
                utt.started = True
                self.emit(message("playback_started", id=utt.id, at_sample=utt.start))
            done = utt.ended and utt.unplaced == 0
            if done and (utt.start is None or self.position >= utt.end):
                self._finish(utt, utt.said(utt.end), interrupted=False)
                self.queue.popleft()
                continue
            break

    def _finish(self, utt: Utterance, played: int, interrupted: bool) -> None:
        if utt.finished:
            return
        utt.finished = True
        self.finished_ids.append(utt.id)
        self.on_finished(interrupted)
        at = (
            (utt.start or 0) + played + sum(n for a, n in utt.gaps if a < (utt.start or 0) + played)
        )
        self.emit(
            message(
                "playback_finished",
                id=utt.id,
                playback_position=round(played / OUTPUT_RATE, 6),
                interrupted=interrupted,
                at_sample=at,
            )
        )

    def describe(self) -> dict:
        return {
            "utterances_queued": len(self.queue),
            "utterance_open": self.open.id if self.open else None,
        }


def _resample(utt: Utterance, mono: np.ndarray | None) -> np.ndarray:
    """Mono int16 at the utterance's rate → 48 kHz (None flushes the resampler's tail)."""
    assert utt.resampler is not None
    if mono is None:
        frames = utt.resampler.resample(None)
    else:
        frame = av.AudioFrame.from_ndarray(mono.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = utt.rate
        frames = utt.resampler.resample(frame)
    if not frames:
        return np.zeros(0, np.int16)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)
