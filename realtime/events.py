"""Session events for agents: JSON messages on the data channel, playback tracking.

Server → peer: `speech_started` / `speech_stopped` (VAD on the input, `at_ms` on the input
timeline), `playback_started` / `playback_finished {position_ms, interrupted}` (when the
avatar actually starts/stops saying a speech segment, on the playout clock), `interrupted
{played_ms}`, `error {message}`. Peer → server: `{"type": "interrupt"}`.

A playback is one VAD speech segment as it is played back; `position_ms` is how much of it
was played. Positions are in 48 kHz timeline samples internally.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.clock import OUTPUT_RATE
from realtime.errors import BadRequest

CLIENT_MESSAGES = ("interrupt", "ping")


def message(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def parse_client_message(raw: str | bytes) -> dict:
    """Validate one data-channel message from the peer."""
    try:
        msg = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"data channel message is not JSON: {exc}") from exc
    if not isinstance(msg, dict) or msg.get("type") not in CLIENT_MESSAGES:
        raise BadRequest(f"data channel message needs type in {CLIENT_MESSAGES}")
    return msg


def ms(samples: int) -> int:
    return int(round(samples * 1000 / OUTPUT_RATE))


@dataclass
class Segment:
    start: int  # timeline samples (48 kHz)
    end: int | None = None
    started: bool = False  # playback_started sent


class PlaybackTracker:
    """Turns VAD segments and the playout position into ordered playback events."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._segments: deque[Segment] = deque()
        self.position = 0

    def speech_started(self, at: int) -> None:
        self._segments.append(Segment(at))

    def speech_stopped(self, at: int) -> None:
        if self._segments and self._segments[-1].end is None:
            self._segments[-1].end = max(at, self._segments[-1].start)

    def played(self, position: int) -> None:
        """Called by the audio track after each 20 ms frame."""
        self.position = position
        while self._segments:
            seg = self._segments[0]
            if not seg.started and position > seg.start:
                seg.started = True
                self._emit(message("playback_started", at_ms=ms(seg.start)))
            if seg.started and seg.end is not None and position >= seg.end:
                self._segments.popleft()
                self._emit(
                    message(
                        "playback_finished",
                        position_ms=ms(seg.end - seg.start),
                        interrupted=False,
                    )
                )
                continue
            break

    def interrupt(self) -> int:
        """Cut all queued speech at the playout position; returns ms played of the current one."""
        played = 0
        current = self._segments[0] if self._segments else None
        if current is not None and current.started:
            played = ms(min(self.position, current.end or self.position) - current.start)
            self._emit(message("playback_finished", position_ms=played, interrupted=True))
        self._segments.clear()
        return played

    def detach(self) -> None:
        """The session closed: emit nothing more (and hold no reference back to it)."""
        self._emit = _ignore


def _ignore(text: str) -> None:
    pass
