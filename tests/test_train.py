"""Training on CPU at the tiny size: each stage's loss goes down, and a run resumes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.diffusion.build import build_models
from pipeline.diffusion.engine import Engine
from pipeline.train import a2v as a2v_train
from pipeline.train import sr as sr_train
from pipeline.train import vae as vae_train
from pipeline.train.__main__ import main as train_main
from pipeline.train.data import SegmentPool, build_speech_cache, load_speech_cache

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def speech_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("speech") / "speech.npz"
    build_speech_cache(path, n_clips=2, min_s=1.0, max_s=2.0)
    return path


@pytest.fixture(scope="module")
def tiny():
    return load_config("tiny")


@pytest.fixture(scope="module")
def pool(speech_path, tiny):
    a = tiny.diffusion.audio
    return SegmentPool.render(
        load_speech_cache(speech_path), 3, 16, 128, a.context_frames, a.lookahead_frames, workers=1
    )


def test_speech_cache_round_trips(speech_path):
    cache = load_speech_cache(speech_path)
    assert len(cache.audio) == 2
    for audio, params in zip(cache.audio, cache.params, strict=True):
        assert len(audio) == len(params) * 640
        assert np.abs(audio).max() > 1000  # real speech, not silence
        assert params[:, 0].max() > 0.2  # the jaw opens


def test_segments_are_deterministic_and_aligned(speech_path, tiny, pool):
    again = SegmentPool.render(load_speech_cache(speech_path), 3, 16, 128, 8, 2, workers=1)
    assert np.array_equal(pool.frames, again.frames)
    assert pool.frames.shape == (3, 16, 128, 128, 3)
    assert pool.audio.shape == (3, (16 + 8 + 2) * 640)


def _overfit(loss_fn, params, steps: int = 25, lr: float = 2e-3) -> tuple[float, float]:
    """Train on one fixed batch (same randomness every step); first and last loss."""
    opt = torch.optim.Adam(params, lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn(torch.Generator().manual_seed(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses[0], losses[-1]


@pytest.mark.slow
def test_vae_loss_goes_down(tiny, pool):
    torch.manual_seed(0)
    vae = build_models(tiny)["vae"].train()
    frames, refs = torch.from_numpy(pool.frames), torch.from_numpy(pool.references)
    x, ref = vae_train.sample_clips(frames, refs, 2, 4, torch.Generator().manual_seed(0))

    def loss_fn(gen):
        torch.manual_seed(0)  # the reparameterisation noise
        return vae_train.vae_loss(vae, x, ref, 1e-4, 4.0)[0]

    first, last = _overfit(loss_fn, vae.parameters())
    assert last < 0.8 * first


def test_contrast_term_weighs_dark_and_light_faces_alike(tiny, pool):
    """The same relative darkening (a mouth opening) costs 4x less plain L1 on a face 4x
    darker; on log light it costs about the same. The decoder stage trains on both."""
    dark, light = torch.full((1, 3, 1, 4, 4), 0.2), torch.full((1, 3, 1, 4, 4), 0.8)
    to_pm1 = lambda v: v * 2 - 1  # noqa: E731
    l1 = [float((to_pm1(v * 0.75) - to_pm1(v)).abs().mean()) for v in (dark, light)]
    logl = [
        float((vae_train.log_light(to_pm1(v * 0.75)) - vae_train.log_light(to_pm1(v))).abs().mean())
        for v in (dark, light)
    ]
    assert abs(l1[0] / l1[1] - 0.25) < 1e-6
    assert 0.75 < logl[0] / logl[1] <= 1.0

    torch.manual_seed(0)
    vae = build_models(tiny)["vae"].train()
    frames, refs = torch.from_numpy(pool.frames), torch.from_numpy(pool.references)
    x, ref = vae_train.sample_clips(frames, refs, 2, 4, torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    plain, logs_plain = vae_train.vae_loss(vae, x, ref, 0.0, 8.0)
    torch.manual_seed(1)
    both, logs = vae_train.vae_loss(vae, x, ref, 0.0, 8.0, contrast_weight=1.5)
    assert "contrast" not in logs_plain and float(logs["contrast"]) > 0
    assert torch.allclose(both, plain + 1.5 * logs["contrast"], atol=1e-6)


def test_latent_normalisation_is_exact(tiny, pool):
    vae = build_models(tiny)["vae"].eval()
    x, _ = vae_train.sample_clips(
        torch.from_numpy(pool.frames),
        torch.from_numpy(pool.references),
        2,
        4,
        torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        before = vae.decoder(vae.encoder(x)[0])[0]
        vae_train.normalize_latents(vae, x)
        mean = vae.encoder(x)[0]
        after = vae.decoder(mean)[0]
    assert mean.pow(2).mean(dim=(0, 2, 3, 4)).sqrt().sub(1).abs().max() < 1e-3
    assert (before - after).abs().max() < 1e-4


@pytest.fixture(scope="module")
def latents(tiny, pool):
    vae = build_models(tiny)["vae"].eval()
    d = tiny.diffusion.a2v.downscale
    full, low = vae_train.encode_frames(vae, torch.from_numpy(pool.frames), d)
    ref_full, ref_low = vae_train.encode_references(vae, torch.from_numpy(pool.references), d)
    return full, low, ref_full, ref_low


@pytest.mark.slow
@pytest.mark.parametrize("mode_name", ["N0", "N", "I"])
def test_a2v_loss_goes_down_for_each_chunk_kind(tiny, pool, latents, mode_name):
    _, low, _, ref_low = latents
    models = build_models(tiny)
    a2v, audio = models["a2v"].train(), models["audio"].train()
    mode = next(m for m in a2v_train.chunk_modes(tiny) if m.name == mode_name)
    x0, au, ref = a2v_train.sample_windows(
        low,
        torch.from_numpy(pool.audio),
        ref_low,
        mode,
        2,
        tiny.diffusion.vae.temporal_ratio,
        8,
        2,
        torch.Generator().manual_seed(0),
    )
    assert au.shape[1] == (mode.length * tiny.diffusion.vae.temporal_ratio + 10) * 640

    def loss_fn(gen):
        return a2v_train.a2v_loss(a2v, audio, x0, au, ref, mode, tiny, gen)[0]

    params = list(a2v.parameters()) + list(audio.parameters())
    first, last = _overfit(loss_fn, params)
    assert last < 0.7 * first


@pytest.mark.slow
def test_sr_loss_goes_down(tiny, latents):
    full, low, ref_full, _ = latents
    sr = build_models(tiny)["sr"].train()
    lo, fu, rf = sr_train.sample_pairs(low, full, ref_full, 2, 3, torch.Generator().manual_seed(0))
    first, last = _overfit(lambda gen: sr_train.sr_loss(sr, lo, fu, rf, gen)[0], sr.parameters())
    assert last < 0.7 * first


@pytest.mark.slow
def test_cli_trains_every_stage_resumes_and_the_engine_loads_it(speech_path, tmp_path):
    out = tmp_path / "run"
    common = [
        "--config",
        "tiny",
        "--speech",
        str(speech_path),
        "--out",
        str(out),
        "--segments",
        "3",
        "--segment-frames",
        "16",
        "--batch",
        "1",
        "--workers",
        "1",
        "--device",
        "cpu",
    ]
    assert train_main(common + ["--steps", "2"]) == 0
    for name in ("vae", "audio", "a2v", "sr"):
        assert (out / "weights" / f"{name}.safetensors").is_file()
    logged = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in logged} == {"vae", "decoder", "a2v", "sr"}
    assert all(np.isfinite(r["loss"]) for r in logged)

    assert train_main(common + ["--steps", "3", "--resume"]) == 0
    for stage in ("vae", "decoder", "a2v", "sr"):
        state = torch.load(out / "state" / f"state_{stage}.pt", weights_only=True)
        assert state["step"] == 3  # continued from 2, not restarted
    steps = [r["step"] for r in logged]
    assert max(steps) == 2

    cfg = load_config("tiny", {"runtime.weights": str(out / "weights")})
    engine = Engine.load(cfg)
    session = engine.new_stream(np.full((128, 128, 3), 120, np.uint8))
    session.push_audio(np.zeros(16_000, np.float32))
    frames = np.concatenate([b.frames for b in session.generate_ready() + session.finish()])
    assert frames.shape == (25, 128, 128, 3)


def test_held_out_score_uses_the_ground_truth_as_the_seam_baseline():
    """`score` on the world's own render is perfect; a jump injected at every seam shows as
    excess seam change over the ground truth at the same frames."""
    from pipeline.synth.dataset import identity_for
    from pipeline.synth.face import render_frames, render_reference
    from pipeline.synth.motion import motion_from_audio
    from pipeline.train.evaluate import EVAL_SEED, held_out_speech, score

    audio = held_out_speech(4.0)
    identity = identity_for(EVAL_SEED, 0)
    truth = render_frames(identity, motion_from_audio(audio, seed=EVAL_SEED), 128)
    reference = render_reference(identity, 128)
    seams = list(range(12, len(truth), 16))

    perfect = score(truth, reference, audio, seams, truth)
    assert perfect["lip_sync_r"] > 0.9
    assert perfect["seam_excess_over_truth"] == 0.0

    jumpy = truth.astype(np.int16)
    for s in seams:  # every piece after a seam a little brighter than the one before
        jumpy[s:] += 6
    jumpy = np.clip(jumpy, 0, 255).astype(np.uint8)
    scored = score(jumpy, reference, audio, seams, truth)
    assert scored["seam_excess_over_truth"] > 0.5
    assert scored["seam_ratio_local"] > perfect["seam_ratio_local"] + 0.5


@pytest.mark.slow
def test_vae_reconstruction_baseline_keeps_the_mouth():
    """The evaluation's floor: the shipped VAE's encode → decode of the ground truth keeps
    the frame count (whole 16-frame pieces) and the lip sync, so a weak generated score is
    the generator's, not the VAE's."""
    from pipeline.config import load_config
    from pipeline.diffusion.engine import Engine
    from pipeline.synth.dataset import identity_for
    from pipeline.synth.face import render_frames, render_reference
    from pipeline.synth.motion import motion_from_audio
    from pipeline.train.evaluate import EVAL_SEED, held_out_speech, recon_scores, reconstruct

    audio = held_out_speech(4.0)
    identity = identity_for(EVAL_SEED, 2)
    truth = render_frames(identity, motion_from_audio(audio, seed=EVAL_SEED), 256)
    engine = Engine.load(load_config("demo"))
    recon = reconstruct(engine, truth)
    assert recon.shape == (len(truth) // 16 * 16, 256, 256, 3) and recon.dtype == np.uint8
    scores = recon_scores(recon, render_reference(identity, 256), audio, [16, 32, 48], 2)
    assert scores["recon_lip_sync_r"] > 0.85
    assert 0.5 < scores["recon_seam_ratio_local"] < 1.5
