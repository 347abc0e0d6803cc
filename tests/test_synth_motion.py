"""Mouth, blink and head tracks: aligned to the audio, smooth, leading, seeded."""

import numpy as np

from pipeline.synth.motion import (
    LEAD_S,
    MotionTrack,
    blink_track,
    motion_from_audio,
    mouth_track_from_audio,
    silence_segments,
)
from pipeline.synth.speech import synthesize

SR = 16_000


def _vowel_burst(start_s: float, stop_s: float, total_s: float) -> np.ndarray:
    """A harmonic 'aa'-like tone between start and stop, silence elsewhere."""
    t = np.arange(int(total_s * SR)) / SR
    tone = sum(np.sin(2 * np.pi * 120 * k * t) / k for k in range(1, 30))
    env = ((t >= start_s) & (t < stop_s)).astype(np.float32)
    return (0.3 * tone * env).astype(np.float32)


def test_one_frame_per_640_samples_and_closed_in_silence():
    track = mouth_track_from_audio(np.zeros(SR * 2 + 1, np.float32))
    assert len(track) == 51  # a partial last frame counts
    assert np.all(track.jaw == 0) and np.all(track.teeth == 0)


def test_mouth_opens_on_sound_and_leads_it():
    audio = _vowel_burst(1.0, 2.0, 3.0)
    jaw = mouth_track_from_audio(audio).jaw
    assert jaw[30:45].mean() > 0.25  # open during the vowel
    assert jaw[:20].max() < 0.02 and jaw[60:].max() < 0.02  # closed well away from it
    # Onset at frame 25: the lead opens the mouth before the sound arrives.
    assert jaw[24] > 0.05
    assert LEAD_S > 0
    # Smooth: no frame-to-frame step bigger than half the range.
    assert np.abs(np.diff(jaw)).max() < 0.5


def test_real_speech_moves_every_mouth_param():
    audio = synthesize("Hello, and welcome. We see zebras, owls and blue moons.", "en", "m3")
    m = mouth_track_from_audio(audio)
    assert m.jaw.max() > 0.5
    assert m.width.max() > 0.2 and m.width.min() < -0.1
    assert m.rounding.max() > 0.2 and m.teeth.max() > 0.5
    for a in (m.jaw, m.rounding, m.teeth):
        assert a.min() >= 0 and a.max() <= 1


def test_silence_segments_found():
    audio = _vowel_burst(1.0, 2.0, 3.5)
    segs = silence_segments(audio)
    assert segs[0][0] == 0 and 20 <= segs[0][1] <= 25
    assert 50 <= segs[-1][0] <= 55 and segs[-1][1] == 88


def test_blinks_are_seeded_and_plausible():
    a = blink_track(25 * 60, np.random.default_rng(1))
    assert np.array_equal(a, blink_track(25 * 60, np.random.default_rng(1)))
    onsets = np.flatnonzero((a[1:] > 0.5) & (a[:-1] <= 0.5))
    assert 8 <= len(onsets) <= 40  # roughly 10-30 blinks a minute
    assert a.max() == 1.0 and (a > 0.5).mean() < 0.1  # eyes are mostly open


def test_full_track_seeded_with_idle_motion_in_silence():
    audio = _vowel_burst(2.0, 4.0, 8.0)
    a, b = motion_from_audio(audio, 3), motion_from_audio(audio, 3)
    assert np.array_equal(a.to_array(), b.to_array())
    assert not np.array_equal(a.head_x, motion_from_audio(audio, 4).head_x)
    quiet = slice(130, 200)  # well after the burst
    # Idle: the head keeps moving a little, never frozen, never wild.
    assert np.std(a.head_x[quiet]) > 1e-3 and np.abs(a.head_x).max() < 0.1
    assert np.abs(np.diff(a.head_x[quiet])).max() > 0
    assert np.abs(np.diff(a.head_x)).max() < 0.01  # smooth
    # Round trip through the dataset's params array.
    assert np.array_equal(MotionTrack.from_array(a.to_array()).to_array(), a.to_array())
