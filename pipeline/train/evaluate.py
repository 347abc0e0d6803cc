"""Score a trained stack on held-out synthetic speech: lip sync, identity drift, seams, speed.

    python -m pipeline.train.evaluate --config demo --seconds 12 [--no-seams] [--recon]
        [--set schedule.boundary_latents=0] [--strip PNG]
    python -m pipeline.train.evaluate --config photo --seconds 12 --identity N

The person and the sentences are drawn from seeds the training data never used. Every
number is measured from the generated pixels by `pipeline.eval.metrics`; the ground truth
is the mouth track the synthetic world derives from the same audio. The engine is the
config's (`pipeline.startup.load_engine`): the diffusion stack gets the reference image,
the photo stack the same image with the world's own face geometry
(`pipeline.photo.reference.prepare_synthetic`), as a `facecast make-reference` PNG gives it.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from pipeline.clock import FPS, model_samples
from pipeline.config import load_config, parse_overrides
from pipeline.diffusion.engine import Engine
from pipeline.errors import ConfigError
from pipeline.eval import metrics as M
from pipeline.media import write_png
from pipeline.photo.engine import PhotoEngine
from pipeline.photo.reference import prepare_synthetic
from pipeline.startup import load_engine
from pipeline.stream import Reference
from pipeline.synth.dataset import identity_for
from pipeline.synth.face import render_frames, render_reference
from pipeline.synth.motion import motion_from_audio, mouth_track_from_audio
from pipeline.synth.speech import random_speech
from pipeline.train.vae import to_unit

EVAL_SEED = 90_001  # far from the training seeds (0 and small integers)


def held_out_speech(seconds: float, seed: int = EVAL_SEED) -> np.ndarray:
    audio, _ = random_speech(np.random.default_rng(seed), seconds, seconds + 0.5)
    return audio[: model_samples(seconds)]


def generate(
    engine: Engine | PhotoEngine, reference: Reference, audio: np.ndarray, block_s: float = 1.0
):
    """Stream `audio` through a session in blocks; frames, the first frame of every
    separately generated piece (the seams), CPU seconds and wall seconds."""
    session = engine.new_stream(reference, seed=0)
    batches = []
    cpu, wall = time.process_time(), time.perf_counter()
    step = model_samples(block_s)
    for i in range(0, len(audio), step):
        session.push_audio(audio[i : i + step])
        batches += session.generate_ready()
    batches += session.finish()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    stage_s = dict(session.times.seconds)
    session.close()
    frames = np.concatenate([b.frames for b in batches])
    seams = [b.start for b in batches[1:] if len(b.frames)]
    return frames, seams, cpu, wall, stage_s


def score(
    frames: np.ndarray,
    reference: np.ndarray,
    audio: np.ndarray,
    seams: list[int],
    truth: np.ndarray | None = None,
    period: int = 1,
) -> dict:
    """Metrics of generated `frames`; with `truth` (the world's render of the same speech),
    the seam ratio is also measured on it at the same frames: how much of the seam change
    the content itself has there (a paired baseline, so schedules with seams at different
    frames compare fairly). `period` is the VAE's frames per latent: seams are compared with
    the other latent starts near them (`metrics.seam_smoothness`); `seam_ratio_local_any_phase`
    compares them with every frame near them, as the first evaluations did."""
    layout = M.measure_layout(reference)
    x = M.to_working(frames)
    offsets = M.register(x, layout)
    opening = M.mouth_opening(x, offsets, layout)
    jaw = mouth_track_from_audio(audio).jaw
    r, lag = M.lip_sync(opening, jaw)
    ref_feat = M.identity_features(M.to_working(reference), np.zeros((1, 2), np.float32), layout)
    dist = M.identity_distance(M.identity_features(x, offsets, layout), ref_feat)
    windows, drift = M.identity_drift(dist, window_s=10.0)
    change = M.frame_change(x, None)
    local, global_ = M.seam_smoothness(change, seams, period=period)
    extra = {"seam_ratio_local_any_phase": round(M.seam_smoothness(change, seams)[0], 3)}
    if truth is not None:
        n = min(len(truth), len(frames))
        truth_change = M.frame_change(M.to_working(truth[:n]), None)
        truth_local, _ = M.seam_smoothness(truth_change, seams, period=period)
        extra = {
            **extra,
            "seam_ratio_local_truth": round(truth_local, 3),
            "seam_excess_over_truth": round(local / truth_local - 1.0, 3),
        }
    return {
        "lip_sync_r": round(r, 3),
        "lip_sync_lag": lag,
        "opening_std": round(float(opening.std()), 5),
        "identity_distance_10s_windows": [round(w, 4) for w in windows],
        "identity_drift": round(drift, 4),
        "seam_ratio_local": round(local, 3),
        "seam_ratio_global": round(global_, 3),
        **extra,
        "frame_std": round(float(frames.std()), 2),
    }


def corner_scores(frames: np.ndarray, truth: np.ndarray, reference: np.ndarray) -> dict:
    """The bottom-left corner's error (`metrics.corner_error`) against the ground-truth
    render of the same speech and against the reference, beside the rest of the frame's."""
    n = min(len(frames), len(truth))
    out = {}
    for name, target in (("truth", truth[:n]), ("reference", reference)):
        corner, elsewhere = M.corner_error(frames[:n], target)
        out[f"corner_mae_{name}"] = round(corner, 2)
        out[f"elsewhere_mae_{name}"] = round(elsewhere, 2)
    return out


def reconstruct(engine: Engine, frames: np.ndarray, piece: int = 16) -> np.ndarray:
    """The engine VAE's encode → decode of `frames` (N, H, W, 3) uint8, `piece` frames at a
    time with the decoder's cache carried (memory stays flat on long clips): what the
    decoder can show of perfect latents. Returns whole pieces only."""
    vae = engine.modules["vae"].model
    dtype = next(vae.parameters()).dtype
    out, cache = [], None
    for i in range(0, len(frames) // piece * piece, piece):
        x = to_unit(torch.from_numpy(frames[i : i + piece]).to(engine.device))
        z = vae.encoder(x.transpose(0, 1)[None].to(dtype))[0]
        rec, cache = vae.decoder(z, cache)
        rec = ((rec[0].float().permute(1, 2, 3, 0).clamp(-1, 1) + 1.0) * 127.5).round()
        out.append(rec.to(torch.uint8).cpu().numpy())
    return np.concatenate(out)


def recon_scores(
    recon: np.ndarray, reference: np.ndarray, audio: np.ndarray, seams: list[int], period: int
) -> dict:
    """Lip sync and seam ratio of the VAE reconstruction of the ground truth: the floor the
    generated video is measured against (no chunks, no sampling, only the VAE)."""
    s = score(recon, reference, audio, seams, period=period)
    return {"recon_lip_sync_r": s["lip_sync_r"], "recon_seam_ratio_local": s["seam_ratio_local"]}


def frame_strip(
    reference: np.ndarray, frames: np.ndarray, n: int = 8, start: int = FPS
) -> np.ndarray:
    """The reference, then `n` frames evenly spread from `start`, side by side."""
    idx = np.linspace(min(start, len(frames) - 1), len(frames) - 1, n).astype(int)
    return np.concatenate([reference] + [frames[i] for i in idx], axis=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--no-seams", action="store_true", help="schedule.seam_latents = 0")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--strip", default=None, help="write a frame strip PNG here")
    p.add_argument("--identity", type=int, default=0)
    p.add_argument(
        "--recon", action="store_true", help="also score the VAE reconstruction of the truth"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. schedule.boundary_latents=0 (repeatable)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {"schedule.seam_latents": 0} if args.no_seams else {}
    overrides.update(parse_overrides(args.set))
    cfg = load_config(args.config, overrides or None)
    photo = cfg.family.photos
    if args.recon and photo:
        raise ConfigError(f"--recon scores a VAE; config {cfg.name!r} is the photo stack")
    if cfg.video.width != cfg.video.height:
        raise ConfigError(f"the synthetic world is square; config {cfg.name!r} is not")
    engine = load_engine(cfg)
    assert isinstance(engine, Engine | PhotoEngine), "the synthetic world's stacks train"
    identity = identity_for(EVAL_SEED, args.identity)
    reference = render_reference(identity, cfg.video.width)
    audio = held_out_speech(args.seconds)
    given: Reference = reference
    if photo:  # what a `facecast make-reference` PNG of this identity gives the photo stack
        v = cfg.video
        given = prepare_synthetic(reference, identity, v.width, v.height, cfg.photo)
    frames, seams, cpu, wall, stage_s = generate(engine, given, audio)
    truth = render_frames(identity, motion_from_audio(audio, seed=EVAL_SEED), cfg.video.width)
    period = cfg.frames_per_latent
    result = score(frames, reference, audio, seams, truth, period)
    result.update(corner_scores(frames, truth, reference))
    if args.recon:
        assert isinstance(engine, Engine)
        recon = reconstruct(engine, truth)
        result.update(recon_scores(recon, reference, audio, seams, period))
        recon_corner = corner_scores(recon, truth[: len(recon)], reference)
        result.update({f"recon_{k}": v for k, v in recon_corner.items()})
    video_s = len(frames) / FPS
    result.update(
        frames=len(frames),
        fps_wall=round(len(frames) / wall, 2),
        rtf_wall=round(wall / video_s, 2),
        rtf_cpu_per_thread=round(cpu / args.threads / video_s, 2),
        stage_seconds={k: round(v, 2) for k, v in stage_s.items()},
    )
    if args.strip:
        write_png(args.strip, frame_strip(reference, frames))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
