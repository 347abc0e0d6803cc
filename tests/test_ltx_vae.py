"""The LTX VAE (SoulX-FlashHead Lite's codec) reproduces the authors' code on tiny random
weights, and a bad VAE_LTX folder fails in one line naming the file.

The fixture was written by `bench/parity/ltx_vae.py --shape tiny --write-fixture ...`: the
authors' CausalVideoAutoencoder with re-randomised weights, saved in the published layout,
the inputs, and their outputs (LtxVAE.encode/decode)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pipeline.errors import CheckpointError
from pipeline.models.ltx import TINY, load_ltx_vae
from pipeline.models.ltx.vae import CONFIG_FILE, WEIGHTS_FILE

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "flashhead_lite"


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    tensors = {k: v.float() for k, v in load_file(FIXTURE / "io.safetensors").items()}
    with safe_open(FIXTURE / "io.safetensors", "pt") as f:
        tensors["noise_seed"] = int(f.metadata()["noise_seed"])
    return tensors


@pytest.fixture(scope="module")
def vae():
    return load_ltx_vae(FIXTURE, "cpu", torch.float32)


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    cos = torch.nn.functional.cosine_similarity(ours.flatten(), theirs.flatten(), dim=0)
    assert cos > 0.99999
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4 * theirs.abs().max().item())


def test_the_fixture_is_the_tiny_config(vae):
    assert vae.config == TINY
    assert json.loads((FIXTURE / CONFIG_FILE).read_text())["_class_name"] == "AutoencoderKLLTXVideo"


def test_encode_mean_matches_the_authors(vae, io):
    with torch.no_grad():
        assert_close(vae.encode(io["video"], sample=False), io["encode_mean"])


def test_encode_sample_matches_the_authors_with_the_same_noise(vae, io):
    gen = torch.Generator().manual_seed(io["noise_seed"])
    with torch.no_grad():
        lat = vae.encode(io["video"], generator=gen)
    assert_close(lat, io["encode_sample"])
    assert not torch.allclose(lat, io["encode_mean"])  # a draw, not the mean


def test_decode_matches_the_authors(vae, io):
    with torch.no_grad():
        video = vae.decode(io["latents"])
    assert video.shape[2] == 1 + 8 * (io["latents"].shape[2] - 1)
    assert_close(video, io["decode"])


def test_bfloat16_stays_close_to_the_authors_fp32(io):
    vae = load_ltx_vae(FIXTURE, "cpu", torch.bfloat16)
    with torch.no_grad():
        video = vae.decode(io["latents"]).float()
    cos = torch.nn.functional.cosine_similarity(video.flatten(), io["decode"].flatten(), dim=0)
    assert video.dtype == torch.float32 and cos > 0.99


def test_a_wrong_input_shape_says_what_is_expected(vae):
    with pytest.raises(ValueError, match=r"1 \+ 8k"):
        vae.encode(torch.zeros(1, 3, 8, 32, 32))


# -- the loader's errors: one line, naming the file ------------------------------------


@pytest.fixture
def folder(tmp_path) -> Path:
    dst = tmp_path / "VAE_LTX"
    dst.mkdir()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        shutil.copy(FIXTURE / name, dst / name)
    return dst


def load_error(folder: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_ltx_vae(folder, "cpu", torch.float32)
    message = str(info.value)
    assert "\n" not in message
    return message


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / CONFIG_FILE).read_text())
    cfg.update(changes)
    (folder / CONFIG_FILE).write_text(json.dumps(cfg))


def edit_weights(folder: Path, edit) -> None:
    state = load_file(folder / WEIGHTS_FILE)
    edit(state)
    save_file(state, str(folder / WEIGHTS_FILE))


def test_a_missing_folder(tmp_path):
    message = load_error(tmp_path / "nowhere")
    assert "nowhere" in message and "SoulX-FlashHead-1_3B" in message


@pytest.mark.parametrize("name", [CONFIG_FILE, WEIGHTS_FILE])
def test_a_missing_file(folder, name):
    (folder / name).unlink()
    message = load_error(folder)
    assert str(folder / name) in message and "not found" in message


def test_a_truncated_weights_file(folder):
    path = folder / WEIGHTS_FILE
    path.write_bytes(path.read_bytes()[:1000])
    message = load_error(folder)
    assert str(path) in message and "not a readable safetensors file" in message


def test_a_config_that_is_not_json(folder):
    (folder / CONFIG_FILE).write_text("{not json")
    assert "not readable JSON" in load_error(folder)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"timestep_conditioning": True}, "timestep_conditioning=True is not the LTX-Video 0.9.0"),
        ({"decoder_inject_noise": [True] * 5}, "decoder_inject_noise"),
        ({"latent_channels": "128"}, "latent_channels='128' should be a positive integer"),
        ({"block_out_channels": [2, 4, 8]}, "block_out_channels=[2, 4, 8] should be a list of 4"),
        ({"patch_sise": 4}, "unknown key 'patch_sise'"),
        ({"_class_name": "AutoencoderKLWan"}, "_class_name='AutoencoderKLWan'"),
    ],
)
def test_a_bad_config_value(folder, changes, expected):
    edit_config(folder, **changes)
    message = load_error(folder)
    assert str(folder / CONFIG_FILE) in message and expected in message


def test_a_config_that_does_not_fit_the_weights(folder):
    edit_config(folder, latent_channels=16)
    message = load_error(folder)
    assert str(folder / WEIGHTS_FILE) in message and "has shape" in message


def test_a_missing_key(folder):
    edit_weights(folder, lambda s: s.pop("latents_std"))
    message = load_error(folder)
    assert (
        str(folder / WEIGHTS_FILE) in message and "missing" in message and "latents_std" in message
    )


def test_an_unmapped_key(folder):
    edit_weights(folder, lambda s: s.update({"decoder.extra.weight": torch.zeros(1)}))
    message = load_error(folder)
    assert "does not have" in message and "decoder.extra.weight" in message


def test_a_wrong_shape(folder):
    edit_weights(folder, lambda s: s.update({"latents_mean": torch.zeros(3)}))
    message = load_error(folder)
    assert "latents_mean has shape (3,)" in message and str(folder / WEIGHTS_FILE) in message
