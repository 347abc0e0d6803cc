"""How a live session behaves: its playout margin, its timeouts, when silence is filled in,
how long an interrupted chunk's frames are still shown. One value per server
(`ServerConfig.session`), copied per session with its seed."""

from __future__ import annotations

from dataclasses import dataclass


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
