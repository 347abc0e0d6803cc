"""A session's control channel: events out to the peer, and the interrupt that passes the parts.

Events (`realtime.events`) leave on the peer's WebRTC data channel, the first few waiting
for it to open, and reach every listener (the speech WebSocket, Pipecat). The channel also
owns what the peer says back in time with playout: VAD segments as they are played
(`PlaybackTracker`) and an agent's utterances (`UtteranceChannel`).

An interrupt is one `Interrupt` message passed through the session's parts in order
(`PeerSession.interrupt`): each flushes its own state and writes down what the parts after
it need (the frame due now, the cut, where new audio starts). An utterance spliced over
queued idle audio passes the same path, as a splice: nothing was being said, so nothing
is reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from aiortc import RTCDataChannel

from realtime.events import PlaybackTracker, message
from realtime.metrics import RealtimeMetrics
from realtime.utterance import UtteranceChannel

log = logging.getLogger(__name__)
UNSENT_MAX = 32  # events kept for a data channel that is not open yet


@dataclass
class Interrupt:
    """One interrupt on its way through a session's parts (control, playout, engine feed,
    audio in, tracks); each fills in what it decided. Positions: `position` in 48 kHz
    timeline samples, the rest in video frames."""

    position: int  # timeline samples the audio track had sent: the played position
    splice: bool = False  # an utterance brought forward over idle audio, not a barge-in
    played_ms: int = 0  # control: ms of the current speech segment (or utterance) played
    now: int = 0  # playout: the frame due at the interrupt
    tail: int = 0  # playout: frames of flushed speech that may still be shown
    cut: int = 0  # engine feed: frames from here on are dropped (or re-timed)
    new_audio: int = 0  # engine feed: the frame where new audio starts
    head: int = 0  # audio in: the timeline's head after the cut (48 kHz samples)


class ControlChannel:
    """Events out (data channel and listeners) and the playback events of what is said."""

    def __init__(
        self,
        session_id: str,
        metrics: RealtimeMetrics,
        utterance_idle_s: float,
        push: Callable[[np.ndarray, Callable[[int | None], None]], None],
        interrupt: Callable[[], object],
        splice: Callable[[], None],
    ) -> None:
        """`push` places utterance audio on the timeline (the audio-in part); `interrupt`
        and `splice` send an `Interrupt` through the session (a clear_buffer, and an
        utterance said over queued idle audio)."""
        self._sid = session_id
        self._channel: RTCDataChannel | None = None
        self._unsent: list[str] = []  # events before the data channel opened
        self.listeners: list[Callable[[str], None]] = []  # more event receivers (WebSockets)
        self.playback = PlaybackTracker(self.send)
        self.speech = UtteranceChannel(
            push,
            interrupt,
            self.send,
            utterance_idle_s,
            splice=splice,
            on_finished=lambda cut: metrics.utterances.labels(
                "interrupted" if cut else "played"
            ).inc(),
        )

    def attach(self, channel: RTCDataChannel, on_message: Callable[[str | bytes], None]) -> None:
        """The peer opened its data channel: queued events go out once it is open."""
        self._channel = channel
        channel.on("open", self._send_unsent)
        self._send_unsent()
        channel.on("message", on_message)

    def played(self, position: int) -> None:
        """The audio track sent timeline samples up to `position`."""
        self.playback.played(position)
        self.speech.played(position)

    def interrupt(self, cut: Interrupt) -> None:
        """First in the chain: what was being said ends here (playback events), and the
        played position of it is written down. A splice cuts nothing of it."""
        if cut.splice:
            return
        played_ms = self.playback.interrupt()
        utterance_ms = self.speech.cut(cut.position)
        # the agent's utterances, once it sends any, are what is being said
        cut.played_ms = utterance_ms if self.speech.active else played_ms

    def interrupted(self, cut: Interrupt) -> None:
        """Last in the chain: the peer hears that the interrupt is done."""
        if not cut.splice:
            self.send(message("interrupted", played_ms=cut.played_ms))

    def send(self, text: str) -> None:
        """An event for the peer: on its data channel and to every listener."""
        self.send_channel(text)
        for listener in list(self.listeners):
            listener(text)

    def send_channel(self, text: str) -> None:
        """Send on the data channel; until it is open, the first few wait for it (the
        pre-roll's `delay_grown` is decided as the first audio arrives)."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            if len(self._unsent) < UNSENT_MAX:
                self._unsent.append(text)
            return
        try:
            while self._unsent:
                channel.send(self._unsent.pop(0))
            channel.send(text)
        except Exception:
            log.exception("session %s: data channel send failed", self._sid)

    def _send_unsent(self) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            while self._unsent:
                self.send(self._unsent.pop(0))

    def stop(self) -> None:
        pass  # events still go out while the other parts close

    async def close(self) -> None:
        """After the session's last event: no listener, callback or queued utterance keeps
        the closed call alive (a reference cycle waits for a full garbage collection)."""
        if self._channel is not None:
            self._channel.remove_all_listeners()
        self.playback.detach()
        self.speech.detach()
        self.listeners.clear()
