"""Configs load with clear errors; the large reference architectures have the right size."""

import logging

import pytest
import yaml

from pipeline.config import CONFIG_DIR, load_config
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


def test_the_diffusion_sections_sit_under_their_key():
    raw = yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text())
    assert not {"vae", "audio", "a2v", "sr", "sampler"} & set(raw)
    cfg = load_config("tiny")
    assert list(cfg.sections) == ["video", "schedule", "diffusion", "runtime"]
    assert (cfg.diffusion.a2v.dim, cfg.diffusion.vae.temporal_ratio) == (64, 2)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_config_with_the_diffusion_sections_at_the_top_still_loads(tmp_path, caplog):
    raw = yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text())
    old = tmp_path / "old.yaml"  # the form before the sections were nested
    old.write_text(yaml.safe_dump({**raw, **raw.pop("diffusion")}))
    with caplog.at_level(logging.INFO):
        cfg = load_config(old)
    (warning,) = _warnings(caplog)
    assert f"move vae, audio, a2v, sr, sampler from the top level of {old}" in warning
    assert "under 'diffusion:'" in warning
    tiny = load_config("tiny")
    assert (cfg.diffusion, cfg.schedule, cfg.video) == (tiny.diffusion, tiny.schedule, tiny.video)

    caplog.clear()
    with caplog.at_level(logging.INFO):
        load_config("tiny")
    assert _warnings(caplog) == []


def test_an_old_section_on_a_nested_base_changes_only_its_keys(tmp_path, caplog):
    old = tmp_path / "fewer_steps.yaml"
    old.write_text("base: tiny\nsampler: {steps: 2}\n")
    with caplog.at_level(logging.INFO):
        cfg = load_config(old)
    assert len(_warnings(caplog)) == 1
    assert (cfg.diffusion.sampler.steps, cfg.diffusion.sampler.shift) == (2, 3.0)
    assert cfg.diffusion.a2v == load_config("tiny").diffusion.a2v
