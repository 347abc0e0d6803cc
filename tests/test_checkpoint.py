"""Checkpoints round-trip through safetensors; mismatches fail with a clear message."""

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.diffusion.build import build_models
from pipeline.diffusion.engine import Engine
from pipeline.errors import CheckpointError
from pipeline.module import load_checkpoint, save_checkpoint


def test_round_trip_gives_identical_outputs(tmp_path):
    cfg = load_config("tiny")
    models = build_models(cfg)
    for name, model in models.items():
        save_checkpoint(model, tmp_path / f"{name}.safetensors")
    other = load_config(
        "tiny", overrides={"runtime.init_seed": 123, "runtime.weights": str(tmp_path)}
    )
    loaded = Engine.load(other)
    for name, model in models.items():
        for key, value in model.state_dict().items():
            assert torch.equal(loaded.modules[name].model.state_dict()[key], value), (name, key)
    fresh = Engine.load(load_config("tiny", overrides={"runtime.init_seed": 123}))
    ref = np.full((64, 64, 3), 90, np.uint8)

    def frames(engine):
        s = engine.new_stream(ref)
        s.push_audio(np.zeros(8000, np.float32))
        return np.concatenate([b.frames for b in s.finish()])

    assert np.array_equal(frames(loaded), frames(Engine.load(cfg)))
    assert not np.array_equal(frames(loaded), frames(fresh))


def test_shape_mismatch_names_the_key(tmp_path):
    small = build_models(load_config("tiny"))["a2v"]
    save_checkpoint(small, tmp_path / "a2v.safetensors")
    bigger = build_models(load_config("tiny", overrides={"a2v.dim": 96}))["a2v"]
    with pytest.raises(
        CheckpointError,
        match=r"other shapes .*audio_mlp.0.bias: checkpoint \(64,\) vs model \(96,\)",
    ):
        load_checkpoint(bigger, tmp_path / "a2v.safetensors")


def test_missing_and_unexpected_keys(tmp_path):
    model = build_models(load_config("tiny"))["sr"]
    save_checkpoint(model, tmp_path / "sr.safetensors")
    deeper = build_models(load_config("tiny", overrides={"sr.depth": 2}))["sr"]
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(deeper, tmp_path / "sr.safetensors")
    shallower = build_models(load_config("tiny", overrides={"sr.depth": 1, "sr.dim": 48}))["sr"]
    shallower.transformer.blocks = shallower.transformer.blocks[:0]
    with pytest.raises(CheckpointError, match="unexpected"):
        load_checkpoint(shallower, tmp_path / "sr.safetensors")


def test_corrupt_file(tmp_path):
    bad = tmp_path / "vae.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(build_models(load_config("tiny"))["vae"], bad)
