"""Configs load with clear errors; the large reference architectures have the right size."""

import pytest

from pipeline.config import load_config
from pipeline.diffusion.build import build_models
from pipeline.diffusion.config import latent_grid
from pipeline.errors import ConfigError


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_rt720_shapes_and_sizes():
    cfg = load_config("rt720")
    grid = latent_grid(cfg)
    assert (grid.full_w, grid.full_h) == (80, 48)  # 720p at 16x: 80x45 padded to 80x48
    assert (grid.full_w * grid.full_h) % 128 == 0  # SR tokens per frame align with tiles
    assert (grid.low_w, grid.low_h) == (40, 24)
    models = build_models(cfg, "meta")
    assert 1.2e9 < params(models["a2v"]) < 1.45e9
    assert 1.2e9 < params(models["sr"]) < 1.45e9
    assert params(models["vae"].decoder) < 10e6  # a light decoder


def test_avatar_iv_scale_exceeds_36_gb_of_bf16():
    models = build_models(load_config("avatar-iv-scale"), "meta")
    total = params(models["a2v"]) + params(models["sr"])
    assert total * 2 > 36e9


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"a2v.depth": "two"}, "a2v.depth.*must be int"),
        ({"sampler.steps": 0}, "sampler.steps"),
        ({"runtime.attention": "magic"}, "runtime.attention.*sdpa"),
        ({"schedule.chunk_latents": 1}, "schedule.chunk_latents"),
        ({"vae.spatial_ratio": 12}, "vae.spatial_ratio"),
        ({"video.fps": 30}, "video.fps"),
        ({"sr.colour": 3}, "unknown config key 'sr.colour'"),
    ],
)
def test_bad_values_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("tiny", overrides=overrides)


def test_unknown_name_lists_known_configs():
    with pytest.raises(ConfigError, match=r"unknown config 'nope'.*tiny"):
        load_config("nope")


def test_invalid_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("video: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
