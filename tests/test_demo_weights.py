"""The shipped demo weights: they load from package data and make a talking face."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.diffusion.engine import Engine
from pipeline.eval import metrics as M
from pipeline.module import PACKAGE_WEIGHTS
from pipeline.synth.dataset import identity_for
from pipeline.synth.face import render_reference
from pipeline.synth.motion import mouth_track_from_audio
from pipeline.synth.speech import synthesize

pytestmark = pytest.mark.timeout(300)


def test_demo_weights_are_shipped_small_and_loaded_from_the_package():
    cfg = load_config("demo")
    assert cfg.runtime.weights == "package:demo"
    files = sorted(p.name for p in (PACKAGE_WEIGHTS / "demo").glob("*.safetensors"))
    assert files == ["a2v.safetensors", "audio.safetensors", "sr.safetensors", "vae.safetensors"]
    assert sum(p.stat().st_size for p in (PACKAGE_WEIGHTS / "demo").iterdir()) <= 50 * 2**20
    Engine.load(cfg)  # strict: every key and shape must match the config


@pytest.fixture(scope="module")
def talking_clip():
    """0.6 s silence, a sentence, 1.2 s silence, from a person the training never saw."""
    speech = synthesize("Put the kettle on, and we will talk about the plan.", "en", "f2")
    audio = np.concatenate([np.zeros(9600, np.float32), 0.7 * speech, np.zeros(19200, np.float32)])
    audio = audio[: len(audio) // 640 * 640]
    reference = render_reference(identity_for(424_242, 0), 256)
    engine = Engine.load(load_config("demo"))
    session = engine.new_stream(reference, seed=0)
    session.push_audio(audio)
    frames = np.concatenate([b.frames for b in session.generate_ready() + session.finish()])
    session.close()
    return reference, audio, frames


@pytest.mark.slow
def test_demo_face_is_not_flat_and_looks_like_the_reference(talking_clip):
    reference, audio, frames = talking_clip
    assert frames.shape == (len(audio) // 640, 256, 256, 3)
    assert frames.std() > 20  # a picture, not a flat colour
    # the person's layout (skin, lips, mouth) is found in every generated frame's place
    layout = M.measure_layout(reference)
    x = M.to_working(frames)
    offsets = M.register(x, layout)
    assert np.abs(offsets).max() < 8  # the head stays where the reference put it
    centre = x[:, 40:88, 40:88].mean(axis=(0, 1, 2))
    assert np.abs(centre - M.to_working(reference)[0, 40:88, 40:88].mean(axis=(0, 1))).max() < 0.15


@pytest.mark.slow
def test_demo_mouth_moves_with_speech(talking_clip):
    reference, audio, frames = talking_clip
    layout = M.measure_layout(reference)
    x = M.to_working(frames)
    opening = M.mouth_opening(x, M.register(x, layout), layout)
    jaw = mouth_track_from_audio(audio).jaw
    r, _ = M.lip_sync(opening, jaw)
    speaking, silent = jaw > 0.3, jaw < 0.02
    assert speaking.sum() > 10 and silent.sum() > 10
    assert opening[speaking].mean() > opening[silent].mean()
    assert r > 0.3
