"""Data-channel events: playback tracking and refusal of bad messages."""

from __future__ import annotations

import json

import pytest
from support.realtime import RATE

from realtime.errors import BadRequest
from realtime.events import PlaybackTracker, parse_client_message


def test_playback_events_in_order_and_interrupt():
    sent = []
    tracker = PlaybackTracker(lambda m: sent.append(json.loads(m)))
    tracker.speech_started(RATE)
    tracker.speech_stopped(2 * RATE)
    tracker.speech_started(3 * RATE)
    for pos in range(0, int(3.5 * RATE) + 960, 960):
        tracker.played(pos)
    assert tracker.interrupt() == 500
    kinds = [(m["type"], m.get("position_ms"), m.get("interrupted")) for m in sent]
    assert kinds == [
        ("playback_started", None, None),
        ("playback_finished", 1000, False),
        ("playback_started", None, None),
        ("playback_finished", 500, True),
    ]


@pytest.mark.parametrize("raw", ["nope", "[]", '{"type": "dance"}', b"\xff"])
def test_bad_data_channel_messages_are_refused(raw):
    with pytest.raises(BadRequest):
        parse_client_message(raw)
