"""espeak-ng speech, the resampler, WAV IO and the bundled assets."""

from pathlib import Path

import numpy as np

from pipeline.media import load_image, read_audio, resample, write_wav
from pipeline.synth.commands import DEFAULT_REFERENCE_SEED, make_reference_main
from pipeline.synth.face import random_identity, render_reference
from pipeline.synth.motion import silence_segments
from pipeline.synth.speech import random_speech, synthesize

ASSETS = Path(__file__).resolve().parents[1] / "pipeline" / "assets"


def test_resample_keeps_the_passband_and_cuts_aliases():
    t = np.arange(22050) / 22050
    for f in (200.0, 1000.0, 3500.0):
        y = resample(np.sin(2 * np.pi * f * t), 22050, 16000)
        assert len(y) == 16000
        ref = np.sin(2 * np.pi * f * np.arange(16000) / 16000)
        # Zero delay, near-unit gain away from the edges.
        assert np.abs(y[100:-100] - ref[100:-100]).max() < 1e-3
    alias = resample(np.sin(2 * np.pi * 9500.0 * t), 22050, 16000)
    assert np.abs(alias[100:-100]).max() < 0.01  # above the new Nyquist: removed


def test_synthesize_gives_16k_speech_and_voices_differ():
    a = synthesize("Hello there.", "en", "m3")
    b = synthesize("Hello there.", "en", "f3")
    assert a.dtype == np.float32 and 0.4 < len(a) / 16000 < 2.0
    assert np.abs(a).max() > 0.05
    assert len(a) != len(b) or not np.allclose(a, b)


def test_random_speech_is_seeded_and_has_pauses():
    a, utts = random_speech(np.random.default_rng(4), 4.0, 6.0)
    b, _ = random_speech(np.random.default_rng(4), 4.0, 6.0)
    assert np.array_equal(a, b)
    assert len(a) / 16000 >= 4.0 and utts
    assert silence_segments(a, min_s=0.3)


def test_wav_round_trip(tmp_path):
    x = (0.5 * np.sin(np.arange(1600) / 5)).astype(np.float32)
    write_wav(tmp_path / "x.wav", x, 16000)
    y = read_audio(tmp_path / "x.wav", 16000)
    assert y.size == x.size and np.abs(x - y).max() < 1e-4


def test_bundled_sample_speech():
    audio = read_audio(ASSETS / "sample_speech.wav", 16000)
    assert 5.0 < len(audio) / 16000 < 8.0
    # A pause between the two sentences (not only the edges).
    inner = [s for s in silence_segments(audio, min_s=0.5) if s[0] > 0 and s[1] < len(audio) // 640]
    assert inner


def test_bundled_reference_is_reproducible(tmp_path):
    ref = load_image(ASSETS / "reference.png")
    assert ref.shape == (256, 256, 3)
    assert np.array_equal(ref, render_reference(random_identity(DEFAULT_REFERENCE_SEED), 256))
    assert (
        make_reference_main(["--seed", "5", "--size", "128", "--out", str(tmp_path / "r.png")]) == 0
    )
    assert np.array_equal(load_image(tmp_path / "r.png"), render_reference(random_identity(5), 128))
