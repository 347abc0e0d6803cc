"""The whole training run: data → VAE → decoder → latents → A2V (+ audio encoder) → SR.

The decoder stage fine-tunes the VAE decoder with the encoder frozen: the latents A2V and
SR learn stay exactly the same, so it can also run on its own after the rest, with more
weight on the pixels that move (the mouth is what lip sync is measured on).

Each stage writes its weights into `<out>/weights/` as soon as it ends (the same
`<name>.safetensors` files `runtime.weights` loads), and its resumable state into
`<state_dir>/state_<stage>.pt`. A rerun with `resume` skips finished stages and continues
an unfinished one from its last save. Losses go to `<out>/losses.jsonl`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from pipeline.config import FacecastConfig
from pipeline.diffusion.a2v_dit import A2VDiT
from pipeline.diffusion.audio_encoder import AudioEncoder
from pipeline.diffusion.build import build_models
from pipeline.diffusion.config import latent_grid
from pipeline.diffusion.sr_dit import SRDiT
from pipeline.diffusion.vae import VAE
from pipeline.module import load_checkpoint, save_checkpoint
from pipeline.train import a2v as a2v_train
from pipeline.train import sr as sr_train
from pipeline.train import vae as vae_train
from pipeline.train.data import SegmentPool, load_speech_cache
from pipeline.train.loop import LossLog, StageSettings, train_stage

STAGES = ("vae", "decoder", "a2v", "sr")


@dataclass
class TrainConfig:
    """Defaults are the shipped demo weights' recipe in one run on one H200 (~18 min in all):
    each stage stops at its step count or its wall-time cap, whichever comes first. The
    shipped weights themselves came from five runs (the stack, then four decoder fine-tunes,
    the last two with the contrast term; ~30 min of H200 in all, `train_summary.json`)."""

    segments: int = 1500
    segment_frames: int = 32
    data_seed: int = 0
    vae_frames: int = 8  # frames per VAE training clip
    kl_weight: float = 2e-4
    motion_weight: float = 4.0
    sr_frames: int = 4  # latent frames per SR training window
    sr_input_noise: float = 0.1  # stands in for the sampler's errors in SR's input
    decoder_motion_weight: float = 8.0
    decoder_contrast_weight: float = 1.5  # L1 on log light too: dark faces keep their mouths
    vae: StageSettings = field(default_factory=lambda: StageSettings(30000, 24, 5e-4, 260.0))
    decoder: StageSettings = field(default_factory=lambda: StageSettings(8000, 24, 2e-4, 330.0))
    a2v: StageSettings = field(default_factory=lambda: StageSettings(100000, 256, 5e-4, 380.0))
    sr: StageSettings = field(default_factory=lambda: StageSettings(30000, 128, 5e-4, 90.0))


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def _done(state_dir: Path, stage: str, settings: StageSettings) -> bool:
    path = state_dir / f"state_{stage}.pt"
    if not path.is_file():
        return False
    st = torch.load(path, map_location="cpu", weights_only=True)
    return st["step"] >= settings.steps or st["seconds"] >= settings.seconds


def train_all(  # noqa: C901 - the four stages in order, each skipped on resume; one recipe to read
    cfg: FacecastConfig,
    tc: TrainConfig,
    speech_path: Path,
    out: Path,
    state_dir: Path,
    stages: tuple[str, ...] = STAGES,
    resume: bool = False,
    device: str = "cpu",
    workers: int | None = None,
) -> dict:
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    weights = out / "weights"
    log = LossLog(out)
    summary: dict = {"config": cfg.name, "train": asdict(tc), "stages": {}}

    # render before CUDA is touched: the pool's worker processes are forked
    speech = load_speech_cache(speech_path)
    pool = SegmentPool.render(
        speech,
        tc.segments,
        tc.segment_frames,
        cfg.video.width,
        cfg.diffusion.audio.context_frames,
        cfg.diffusion.audio.lookahead_frames,
        seed=tc.data_seed,
        workers=workers,
    )
    summary["data"] = {"segments": tc.segments, "render_s": round(pool.seconds, 1)}
    print(f"[data] {tc.segments} segments x {tc.segment_frames} frames in {pool.seconds:.1f} s")

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True  # the VAE's conv shapes repeat every step
    frames = torch.from_numpy(pool.frames).to(dev)
    refs = torch.from_numpy(pool.references).to(dev)
    audio = torch.from_numpy(pool.audio).to(dev)
    models = build_models(cfg, dev)
    gen = torch.Generator().manual_seed(tc.data_seed + 1)  # batch indices (small, host)
    noise_gen = torch.Generator(device=dev).manual_seed(tc.data_seed + 2)  # noise, on device
    d = cfg.diffusion.a2v.downscale

    # -- VAE --------------------------------------------------------------------------
    vae, a2v, audio_encoder, sr = (
        models["vae"],
        models["a2v"],
        models["audio"],
        models["sr"],
    )
    assert isinstance(vae, VAE) and isinstance(a2v, A2VDiT)
    assert isinstance(audio_encoder, AudioEncoder) and isinstance(sr, SRDiT)
    if "vae" in stages and not (
        resume and (weights / "vae.safetensors").is_file() and _done(state_dir, "vae", tc.vae)
    ):

        def vae_step(step: int):
            x, ref = vae_train.sample_clips(frames, refs, tc.vae.batch, tc.vae_frames, gen)
            if d > 1 and step % 4 == 3:  # the engine also encodes at the A2V grid's scale
                x, ref = vae_train.half_res(x, ref)
            with _autocast(dev):
                return vae_train.vae_loss(vae, x, ref, tc.kl_weight, tc.motion_weight)

        summary["stages"]["vae"] = train_stage(
            "vae", vae, vae_step, tc.vae, state_dir=state_dir, log=log, resume=resume
        )
        x, _ = vae_train.sample_clips(frames, refs, 32, tc.vae_frames, gen)
        scale = vae_train.normalize_latents(vae, x)
        summary["latent_scale"] = [round(float(s), 4) for s in scale]
        save_checkpoint(vae, weights / "vae.safetensors")
    else:
        load_checkpoint(vae, weights / "vae.safetensors")
    vae.eval().requires_grad_(False)

    # -- VAE decoder, encoder frozen --------------------------------------------------
    if "decoder" in stages and not (resume and _done(state_dir, "decoder", tc.decoder)):
        vae.decoder.requires_grad_(True)

        def decoder_step(step: int):
            x, ref = vae_train.sample_clips(frames, refs, tc.decoder.batch, tc.vae_frames, gen)
            with _autocast(dev):
                return vae_train.vae_loss(
                    vae, x, ref, 0.0, tc.decoder_motion_weight, tc.decoder_contrast_weight
                )

        summary["stages"]["decoder"] = train_stage(
            "decoder",
            vae.decoder,
            decoder_step,
            tc.decoder,
            state_dir=state_dir,
            log=log,
            resume=resume,
        )
        vae.eval().requires_grad_(False)
        save_checkpoint(vae, weights / "vae.safetensors")

    if not {"a2v", "sr"} & set(stages):
        return _finish(summary, out, t_start)
    t = time.perf_counter()
    full, low = vae_train.encode_frames(vae, frames, d)
    ref_full, ref_low = vae_train.encode_references(vae, refs, d)
    summary["encode_s"] = round(time.perf_counter() - t, 1)
    summary["latent_std"] = {"full": round(float(full.std()), 4), "low": round(float(low.std()), 4)}
    print(f"[encode] full {tuple(full.shape)} low {tuple(low.shape)} std {summary['latent_std']}")

    # -- A2V + audio encoder ----------------------------------------------------------
    pair = nn.ModuleDict({"a2v": a2v, "audio": audio_encoder})
    if "a2v" in stages and not (resume and _done(state_dir, "a2v", tc.a2v)):
        modes = a2v_train.chunk_modes(cfg)
        probs = torch.tensor([m.weight for m in modes])
        ctx, look = cfg.diffusion.audio.context_frames, cfg.diffusion.audio.lookahead_frames

        def a2v_step(step: int):
            mode = modes[int(torch.multinomial(probs, 1, generator=gen))]
            x0, au, ref = a2v_train.sample_windows(
                low,
                audio,
                ref_low,
                mode,
                tc.a2v.batch,
                cfg.diffusion.vae.temporal_ratio,
                ctx,
                look,
                gen,
            )
            with _autocast(dev):
                return a2v_train.a2v_loss(a2v, audio_encoder, x0, au, ref, mode, cfg, noise_gen)

        summary["stages"]["a2v"] = train_stage(
            "a2v", pair, a2v_step, tc.a2v, state_dir=state_dir, log=log, resume=resume
        )
    elif (state_dir / "state_a2v.pt").is_file():
        pair.load_state_dict(torch.load(state_dir / "state_a2v.pt", weights_only=True)["model"])
    save_checkpoint(a2v, weights / "a2v.safetensors")
    save_checkpoint(audio_encoder, weights / "audio.safetensors")

    # -- SR ---------------------------------------------------------------------------
    if "sr" in stages and not (resume and _done(state_dir, "sr", tc.sr)):

        def sr_step(step: int):
            lo, fu, rf = sr_train.sample_pairs(low, full, ref_full, tc.sr.batch, tc.sr_frames, gen)
            with _autocast(dev):
                return sr_train.sr_loss(sr, lo, fu, rf, noise_gen, tc.sr_input_noise)

        summary["stages"]["sr"] = train_stage(
            "sr", sr, sr_step, tc.sr, state_dir=state_dir, log=log, resume=resume
        )
    elif (state_dir / "state_sr.pt").is_file():
        sr.load_state_dict(torch.load(state_dir / "state_sr.pt", weights_only=True)["model"])
    save_checkpoint(sr, weights / "sr.safetensors")
    return _finish(summary, out, t_start)


def _finish(summary: dict, out: Path, t_start: float) -> dict:
    summary["total_s"] = round(time.perf_counter() - t_start, 1)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def check_grid(cfg: FacecastConfig) -> None:
    g = latent_grid(cfg)
    if (g.pixel_h, g.pixel_w) != (cfg.video.height, cfg.video.width):
        raise ValueError(
            f"training renders {cfg.video.width}x{cfg.video.height} frames, but the latent grid "
            f"pads them to {g.pixel_w}x{g.pixel_h}; pick a video size the VAE divides exactly"
        )
    if cfg.video.width != cfg.video.height:
        raise ValueError("the synthetic world renders square frames; use a square video size")
