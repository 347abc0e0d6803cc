"""The peer's audio on the way in: downmix and resampling, the playback timeline."""

from __future__ import annotations

import av
import numpy as np
from support.realtime import RATE

from realtime.audio_in import InputResampler
from realtime.buffers import PlaybackTimeline


def stereo_frame(pcm: np.ndarray) -> av.AudioFrame:
    """What aiortc's Opus decoder yields: 48 kHz stereo s16, interleaved."""
    inter = np.repeat(pcm.astype(np.int16), 2).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(inter, format="s16", layout="stereo")
    frame.sample_rate = RATE
    return frame


def test_resampler_downmixes_and_keeps_the_pitch():
    t = np.arange(RATE) / RATE
    tone = (8000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    r = InputResampler()
    mono48 = np.concatenate(
        [r.mono48(stereo_frame(tone[i : i + 960])) for i in range(0, RATE, 960)]
    )
    pcm16 = np.concatenate([r.to16(mono48[i : i + 960]) for i in range(0, mono48.size, 960)])
    assert abs(mono48.size - RATE) < 100 and abs(pcm16.size - 16000) < 100
    spectrum = np.abs(np.fft.rfft(pcm16[1000:15000]))
    peak_hz = np.argmax(spectrum) * 16000 / 14000
    assert abs(peak_hz - 1000) < 5
    assert pcm16.dtype == np.float32 and np.abs(pcm16).max() <= 1.0


def test_timeline_read_mute_truncate_release():
    tl = PlaybackTimeline()
    tl.append(np.arange(1, 1001, dtype=np.int16))
    tl.append(np.arange(1001, 2001, dtype=np.int16))
    assert tl.head == 2000
    assert list(tl.read(998, 4)) == [999, 1000, 1001, 1002]
    assert list(tl.read(1998, 4)) == [1999, 2000, 0, 0]  # past the head: silence
    tl.mute(1000, 1002)
    assert list(tl.read(998, 6)) == [999, 1000, 0, 0, 1003, 1004]
    assert tl.truncate(1500) == 500 and tl.head == 1500
    assert list(tl.read(1498, 4)) == [1499, 1500, 0, 0]
    tl.release_before(1200)
    assert tl.base == 1000  # whole chunks are released
