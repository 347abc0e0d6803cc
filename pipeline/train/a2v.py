"""A2V stage: flow matching on low-res latent windows, with the audio encoder trained jointly.

Every step draws one chunk shape the engine runs (`chunk_modes`): a first N chunk (no
known frames), a later N chunk (its first `b` frames known: the previous chunk's
boundary), or an I chunk (both ends known: the seam anchors). Known frames are pinned to
their clean latents in the input, given through the known/mask channels, and left out of
the loss, exactly as `pipeline.diffusion.sampler` pins them while sampling. Known latents get a
little noise, because at run time they are the model's own earlier outputs.

Audio: each window gets the samples the context stage would read — `context_frames`
before and `lookahead_frames` after — and the encoder's features for the window's frames.

Convention (as the sampler): x_t = (1 - t) x0 + t noise, target v = noise - x0.
Legend: B batch, C latent channels, T latent frames, h/w A2V grid, r frames per latent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.diffusion.a2v_dit import A2VDiT
from pipeline.diffusion.audio_encoder import AudioEncoder


@dataclass(frozen=True)
class ChunkMode:
    name: str
    length: int  # latent frames in the sequence
    known: tuple[int, ...]  # known positions
    weight: float  # how often it is drawn


def chunk_modes(cfg: FacecastConfig) -> list[ChunkMode]:
    s = cfg.schedule
    b, w = s.boundary_latents, s.seam_latents
    modes = [
        ChunkMode("N0", s.first_chunk_latents, (), 0.2),
        ChunkMode("N", b + s.chunk_latents, tuple(range(b)), 0.5),
    ]
    if w > 0:
        modes.append(ChunkMode("I", 2 * w + 2, (0, 2 * w + 1), 0.3))
    return modes


def sample_t(batch: int, shift: float, gen, device) -> Tensor:
    """Logit-normal timesteps pushed toward high noise by the sampler's shift."""
    u = torch.sigmoid(torch.randn(batch, generator=gen, device=device))
    return shift * u / (1 + (shift - 1) * u)


def motion_weights(x0_BCThw: Tensor, strength: float = 2.0) -> Tensor:
    """(B, 1, 1, h, w): 1 + strength x how much each cell changes over the window,
    relative to the sample's mean change — the mouth and the moving head count more."""
    std = x0_BCThw.std(dim=2, keepdim=True).mean(dim=1, keepdim=True)
    rel = std / std.mean(dim=(3, 4), keepdim=True).clamp_min(1e-6)
    return 1.0 + strength * rel.clamp(max=4.0)


def sample_windows(
    low_SCFhw: Tensor,
    audio_SN: Tensor,
    ref_SC1hw: Tensor,
    mode: ChunkMode,
    batch: int,
    r: int,
    ctx: int,
    look: int,
    gen,
) -> tuple[Tensor, Tensor, Tensor]:
    """Latent windows (B, C, T, h, w), their audio samples (B, (T r + ctx + look) 640) and
    reference latents (B, C, 1, h, w). Segment audio starts `ctx` frames before frame 0."""
    S, _, Fl = low_SCFhw.shape[:3]
    T = mode.length
    dev = low_SCFhw.device
    seg = torch.randint(0, S, (batch,), generator=gen).to(dev)
    p = torch.randint(0, Fl - T + 1, (batch,), generator=gen).to(dev)
    lat = low_SCFhw[seg[:, None], :, p[:, None] + torch.arange(T, device=dev)[None]]
    lat = lat.permute(0, 2, 1, 3, 4)  # (B, T, C, h, w) → (B, C, T, h, w)
    n = (T * r + ctx + look) * MODEL_SAMPLES_PER_FRAME
    a0 = p * r * MODEL_SAMPLES_PER_FRAME
    audio = audio_SN[seg[:, None], a0[:, None] + torch.arange(n, device=dev)[None]]
    return lat, audio, ref_SC1hw[seg]


def a2v_loss(
    a2v: A2VDiT,
    audio_enc: AudioEncoder,
    x0: Tensor,
    audio_BS: Tensor,
    ref: Tensor,
    mode: ChunkMode,
    cfg: FacecastConfig,
    gen,
    known_noise: float = 0.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Flow-matching loss of one batch. `gen` is a generator on the batch's device: drawing
    the noise on the host and copying it over made the host the bottleneck."""
    B, C, T, h, w = x0.shape
    dev = x0.device
    ctx, r = cfg.diffusion.audio.context_frames, cfg.diffusion.vae.temporal_ratio
    feats = audio_enc(audio_BS)[:, ctx : ctx + T * r]
    mask = torch.zeros(B, T, device=dev)
    if mode.known:
        mask[:, list(mode.known)] = 1.0
    m = mask[:, None, :, None, None]
    known = (x0 + known_noise * torch.randn(x0.shape, generator=gen, device=dev)) * m
    noise = torch.randn(x0.shape, generator=gen, device=dev)
    t = sample_t(B, cfg.diffusion.sampler.shift, gen, dev)
    tt = t[:, None, None, None, None]
    xt = ((1 - tt) * x0 + tt * noise) * (1 - m) + known
    v = a2v(xt, t, known, mask, feats, ref)
    wts = motion_weights(x0) * (1 - m)
    err = (v.float() - (noise - x0)).pow(2)
    loss = (wts * err).sum() / (wts.sum() * C).clamp_min(1.0)
    # x0 estimate error on unknown frames: the number that tracks sample quality
    x0_err = ((xt - tt * v.float()) - x0).pow(2).mul(1 - m).sum() / ((1 - m).sum() * C * h * w)
    return loss, {"x0_mse": x0_err.detach()}
