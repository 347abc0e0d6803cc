"""Voice activity detection with the real silero-vad model: edges, per-session state, threads."""

from __future__ import annotations

import numpy as np
import pytest
from support.realtime import make_speech_wav

from realtime.audio_in import InputResampler
from realtime.vad import VoiceActivityDetector


def test_vad_finds_speech_edges_within_100_ms(tmp_path):
    plan = [
        0.8,
        "Hello there, how are you today?",
        1.2,
        "The quick brown fox jumps.",
        1.0,
        "Seven, eight, nine.",
        0.9,
        "Good bye then.",
        0.7,
    ]
    wav = make_speech_wav(tmp_path / "v.wav", plan)
    r, vad = InputResampler(), VoiceActivityDetector()
    events = []
    for i in range(0, wav.pcm.size, 960):  # 20 ms frames, as WebRTC delivers them
        events += vad.feed(r.to16(wav.pcm[i : i + 960]))
    starts = [e.ms / 1000 for e in events if e.kind == "speech_started"]
    stops = [e.ms / 1000 for e in events if e.kind == "speech_stopped"]
    assert len(starts) == len(stops) == len(wav.segments), events
    for (t0, t1), s, e in zip(wav.segments, starts, stops, strict=True):
        assert abs(s - t0) <= 0.1 and abs(e - t1) <= 0.1, (wav.segments, starts, stops)


def test_vad_state_is_per_session_and_survives_garbage(tmp_path):
    wav = make_speech_wav(tmp_path / "v.wav", [0.3, "Hello there.", 0.6])
    r = InputResampler()
    speech16 = r.to16(wav.pcm)
    talker, quiet = VoiceActivityDetector(), VoiceActivityDetector()
    got_talker, got_quiet = [], []
    for i in range(0, speech16.size, 320):  # interleaved, like two live sessions
        got_talker += talker.feed(speech16[i : i + 320])
        got_quiet += quiet.feed(np.zeros(320, np.float32))
    assert [e.kind for e in got_talker] == ["speech_started", "speech_stopped"]
    assert got_quiet == []
    garbage = np.array([np.nan, np.inf, -np.inf, 7.0, -7.0] * 400, np.float32)
    assert quiet.feed(garbage) is not None  # no exception, whatever it decides


@pytest.mark.slow  # runs the command line in a process of its own
def test_loading_the_vad_leaves_torch_threads_alone():
    """silero-vad's import pins torch to one thread; the engine shares the process."""
    import subprocess
    import sys

    code = (
        "import torch; torch.set_num_threads(2); import realtime.server, realtime.vad; "
        "print(torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"
