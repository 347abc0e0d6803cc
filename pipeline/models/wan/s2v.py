"""LiveAvatar's transformer: Wan2.2-S2V-14B run block-causally with a rolling KV cache.

The network is Wan2.2's speech-to-video DiT (the LiveAvatar release merges a distilled LoRA
into it; that happens before the weights reach this module). Inference streams it: the
reference image and the packed motion latents are run once as the *sink*, whose keys and
values every later block attends to; the video is then generated in blocks of
`frames_per_block` latent frames, each denoised in a few Euler steps, each attending to the
sink and to the last `window_frames` latent frames (its own included) of keys and values.

What a caller does, per stream and per block:

    model = S2VTransformer(cfg)            # weights: pipeline.liveavatar.s2v_weights.load_published
    cache = model.new_cache(batch, (lat_h, lat_w), steps=4, device=dev, dtype=dt)
    model.prefill(cache, prompt_BLC, ref_BC1HW, motion_BCTHW)   # once: text K/V + sink K/V
    for each block:                                             # 3 latent frames = 12 video frames
        audio = model.encode_audio(w2v_BSAF)                    # (B, 25, 1024, 12) hidden states
        x = noise_BC3HW
        for step in range(4):                                   # timesteps, sigmas = euler_sigmas()
            v = model.forward_block(x, timesteps[step : step + 1], audio, cache, step)
            x = x + (sigmas[step + 1] - sigmas[step]) * v
        cache.advance()                                         # the next block's ring slot

`prompt_BLC` is the umT5 encoder's output for the prompt's real tokens (B, L, 4096), as
the authors' T5EncoderModel returns it; `ref_BC1HW` the VAE latents of the reference image
(their encode of the image repeated 5 frames, first latent dropped); `motion_BCTHW` the
latents of the motion frames (their encode of the image repeated 73 frames: 19 latent
frames; fewer are zero-padded in front); `w2v_BSAF` the block's 12 video-rate frames of
all 25 wav2vec2-large hidden states, in the authors' layout (B, layers, width, frames).
`prefill` may be called again mid-stream to replace the sink (the authors'
`--enable_online_decode` does it once, after the first 4 blocks, with the first generated
latent frame as the reference and the re-encoded last 73 frames as motion).

How the authors commit a block (`causal_s2v_pipeline.py`): there is no clean re-run at t=0.
They keep one KV cache per sampling step, and step i of a block writes its own keys and
values (computed from step i's noisy input) into cache i while attending to it; the next
block's step i then sees the past blocks as they were at step i. `forward_block(.., step)`
does the same: the write happens inside the forward, `advance()` only moves the ring.

Facts of the authors' inference path this module reproduces (see the parity scripts):
- the sink is the reference latents (time position 30) and FramePack's motion tokens
  (buckets 1, 2, 16 latent frames at 1x, 2x, 4x compression, time positions -1, -3 and
  -19, -14, -9, -4), embedded with the zero-timestep modulation; its keys are kept
  un-rotated and rotated on every forward: the reference slides along so that it sits
  `ref_distance` frames ahead of the block (the authors draw this from 4..30 on every
  forward; here it is an argument), the motion tokens stay where they are;
- RoPE angles are applied with cos/sin rounded to fp16 (their tables are complex32);
- the cross-attention to the text reads its input rounded to bf16, whatever the dtype;
- the audio of a block is encoded alone, after 73 copies of its first frame.

Beside this file: `s2v_block` (one layer, and the output head), `s2v_sink` (the sink's
tokens, every token's RoPE position), `s2v_audio` (the audio encoder and injection),
`s2v_cache` (the stream's state and how a forward reads it). The key table and random
release-shaped weights are LiveAvatar's (`pipeline.liveavatar.s2v_weights`).

Legend: B batch, C latent channels, T latent frames, H/W latent height/width, h/w token
grid, L tokens, P tokens per latent frame, D model width, N heads, K head dim, S wav2vec2
hidden states, A wav2vec2 width, F audio (video-rate) frames, M audio tokens per frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.wan.layers import sinusoid
from pipeline.models.wan.s2v_audio import AudioInjector, AudioTokens, CausalAudioEncoder, linear32
from pipeline.models.wan.s2v_block import FrameHead, S2VBlock
from pipeline.models.wan.s2v_cache import (
    BlockCausalMask,
    CachedStep,
    KeyValues,
    S2VCache,
    SinkPrefill,
)
from pipeline.models.wan.s2v_sink import (
    FramePack,
    Rope,
    block_positions,
    grid,
    motion_positions,
    rope_fp16,
)

__all__ = ["AudioTokens", "S2VCache", "S2VConfig", "S2VTransformer"]


@dataclass(frozen=True)
class S2VConfig:
    """The fields of the release's `config.json` that shape the network (full = 14B), then
    what the authors fix in code rather than in config.json."""

    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    num_heads: int = 40
    num_layers: int = 40
    in_dim: int = 16
    out_dim: int = 16
    text_dim: int = 4096
    text_len: int = 512
    patch_size: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    cond_dim: int = 16
    audio_dim: int = 1024
    num_audio_token: int = 4
    audio_inject_layers: tuple[int, ...] = (0, 4, 8, 12, 16, 20, 24, 27, 30, 33, 36, 39)
    motion_frames: int = 73  # video frames of motion context; 19 latent frames
    # fixed by the authors' code
    audio_layers: int = 1 + 24  # wav2vec2-large's hidden states: embeddings + 24 layers
    zip_frame_buckets: tuple[int, int, int] = (1, 2, 16)
    ref_position: int = 30  # the reference latent's time position in the sink
    # the streaming run (causal_s2v_pipeline.py + wan_s2v_14B_modified.py)
    frames_per_block: int = 3
    window_frames: int = 12
    ref_distance: int = 30  # frames the reference sits ahead of a block (authors: 4..30)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def motion_latent_frames(self) -> int:
        return (self.motion_frames + 3) // 4

    @classmethod
    def tiny(cls) -> S2VConfig:
        """Test size: every path of the full model, a few thousand parameters a layer."""
        return cls(
            dim=64,
            ffn_dim=96,
            num_heads=2,
            num_layers=3,
            text_dim=32,
            audio_dim=32,
            audio_inject_layers=(0, 2),
        )

    @classmethod
    def from_release(cls, raw: dict) -> S2VConfig:
        """From the release's `config.json` (diffusers' names for the constructor's
        arguments); keys that do not shape the network are left alone."""
        kept: dict[str, Any] = {}
        for f in ("dim", "ffn_dim", "freq_dim", "num_heads", "num_layers", "in_dim", "out_dim"):
            kept[f] = int(raw[f]) if f in raw else getattr(cls, f)
        for f in ("text_dim", "text_len", "cond_dim", "audio_dim", "num_audio_token"):
            kept[f] = int(raw[f]) if f in raw else getattr(cls, f)
        kinds = dict(motion_frames=int, eps=float, patch_size=tuple, audio_inject_layers=tuple)
        for f in sorted(kinds.keys() & raw.keys()):
            kept[f] = kinds[f](raw[f])
        return cls(**kept)


def euler_sigmas(steps: int = 4, shift: float = 3.0, train_steps: int = 1000) -> Rope:
    """(timesteps (steps,), sigmas (steps + 1,)) in fp32, as the authors sample: diffusers'
    `FlowMatchEulerDiscreteScheduler(shift=3).set_timesteps(4)`, whose schedule is shifted
    twice (its smallest sigma is the shifted 1/1000, then the spaced sigmas are shifted
    again): 1, 0.858, 0.602, 0.0089, 0, not the once-shifted 1, 0.9, 0.75, 0.5, 0."""
    s = torch.tensor([1.0 / train_steps], dtype=torch.float32)  # their fp32 table's last
    sigma_min = (shift * s / (1 + (shift - 1) * s)).item()
    t = np.linspace(1.0 * train_steps, sigma_min * train_steps, steps) / train_steps
    sigmas = torch.from_numpy(shift * t / (1 + (shift - 1) * t)).float()
    return sigmas * train_steps, torch.cat([sigmas, torch.zeros(1)])


# -- the model --------------------------------------------------------------------------------


class S2VTransformer(nn.Module):
    def __init__(self, cfg: S2VConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, p = cfg.dim, cfg.patch_size
        self.patch_embedding = nn.Conv3d(cfg.in_dim, d, kernel_size=p, stride=p)
        self.cond_encoder = nn.Conv3d(cfg.cond_dim, d, kernel_size=p, stride=p)
        self.text_embedding = nn.Sequential(
            nn.Linear(cfg.text_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d)
        )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.blocks = nn.ModuleList(
            [S2VBlock(d, cfg.ffn_dim, cfg.num_heads, cfg.eps) for _ in range(cfg.num_layers)]
        )
        self.head = FrameHead(d, cfg.out_dim * math.prod(p), cfg.eps)
        # the published name, misspelling included
        self.casual_audio_encoder = CausalAudioEncoder(
            cfg.audio_layers, cfg.audio_dim, d, cfg.num_audio_token
        )
        self.audio_injector = AudioInjector(cfg.audio_inject_layers, d, cfg.num_heads, cfg.eps)
        self.trainable_cond_mask = nn.Embedding(3, d)  # rows: noisy, reference, motion
        self.frame_packer = FramePack(cfg.zip_frame_buckets, cfg.in_dim, d)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    def layers(self) -> list[S2VBlock]:
        return [cast(S2VBlock, b) for b in self.blocks]

    # -- per stream ----------------------------------------------------------------------------

    def new_cache(
        self,
        batch: int,
        latent_hw: tuple[int, int],
        steps: int,
        device: torch.device | str,
        dtype: torch.dtype,
        kv_fp8: bool = False,
    ) -> S2VCache:
        """A stream's cache; `kv_fp8`: the step buffers' keys and values in e4m3, each layer
        scaled by its own pair of numbers (`S2VCache.store`)."""
        cfg = self.cfg
        H, W = latent_hw
        if H % 8 or W % 8:
            raise ValueError(
                f"latent size {H}x{W} must be a multiple of 8 (FramePack compresses the "
                "motion latents 4x after the 2x2 patch): pick a video size divisible by 64"
            )
        if cfg.window_frames % cfg.frames_per_block:
            raise ValueError("window_frames must be a whole number of blocks")
        h, w = H // cfg.patch_size[1], W // cfg.patch_size[2]
        motion = motion_positions(cfg.zip_frame_buckets, h, w)
        ref = grid([cfg.ref_position], list(range(h)), list(range(w)))
        sink = torch.cat([ref, motion])
        block_tokens = cfg.frames_per_block * h * w
        slots = cfg.window_frames // cfg.frames_per_block
        n, k = cfg.num_heads, cfg.head_dim
        shape = (steps, cfg.num_layers, batch, n, len(sink) + slots * block_tokens, k)
        text_shape = (cfg.num_layers, batch, n, cfg.text_len, k)
        kv_dtype = torch.float8_e4m3fn if kv_fp8 else dtype
        descales = (
            (torch.ones(cfg.num_layers, device=device), torch.ones(cfg.num_layers, device=device))
            if kv_fp8
            else (None, None)
        )
        return S2VCache(
            k=torch.zeros(shape, device=device, dtype=kv_dtype),
            v=torch.zeros(shape, device=device, dtype=kv_dtype),
            sink_k=torch.zeros(cfg.num_layers, batch, len(sink), n, k, device=device, dtype=dtype),
            text_k=torch.zeros(text_shape, device=device, dtype=dtype),
            text_v=torch.zeros(text_shape, device=device, dtype=dtype),
            sink_rope_pos=sink.to(device),
            k_descale=descales[0],
            v_descale=descales[1],
            grid=(h, w),
            ref_tokens=h * w,
            block_tokens=block_tokens,
            slots=slots,
        )

    def embed_text(self, prompt_BLC: Tensor) -> Tensor:
        """umT5 tokens (B, L <= text_len, 4096) → (B, text_len, D); zero-padded to
        text_len first, and the padding is attended to (as the authors do)."""
        B, L, _ = prompt_BLC.shape
        if L > self.cfg.text_len:
            raise ValueError(f"prompt has {L} tokens, at most {self.cfg.text_len} fit")
        padded = prompt_BLC.new_zeros(B, self.cfg.text_len, prompt_BLC.shape[-1])
        padded[:, :L] = prompt_BLC
        return self.text_embedding(padded.to(self.dtype))

    def sink_shift(self, frame0: int, ref_distance: int | None) -> int:
        """How far the reference has slid for a block starting at latent frame `frame0`: it
        sits at max(30, frame0 + distance); the motion tokens stay."""
        cfg = self.cfg
        dist = cfg.ref_distance if ref_distance is None else ref_distance
        return max(0, frame0 - (cfg.ref_position - dist))

    def sink_rope(self, cache: S2VCache, shift: int) -> Rope:
        """The sink's RoPE with the reference slid by `shift` latent frames."""
        pos = cache.sink_rope_pos.clone()
        pos[: cache.ref_tokens, 0] += shift
        return rope_fp16(pos, self.cfg.head_dim)

    def time_modulation(self, t_BT: Tensor) -> tuple[Tensor, Tensor]:
        """(e_BTD, mod_BT6D) in fp32, one per latent frame."""
        B, T = t_BT.shape
        f = sinusoid(t_BT.flatten(), self.cfg.freq_dim).float()
        lin1, lin2 = (
            cast(nn.Linear, self.time_embedding[0]),
            cast(nn.Linear, self.time_embedding[2]),
        )
        e = linear32(lin2, F.silu(linear32(lin1, f)))
        mod = linear32(cast(nn.Linear, self.time_projection[1]), F.silu(e))
        return e.view(B, T, -1), mod.view(B, T, 6, -1)

    @torch.no_grad()
    def prefill(
        self, cache: S2VCache, prompt_BLC: Tensor, ref_BC1HW: Tensor, motion_BCTHW: Tensor
    ) -> None:
        """Once per stream: embed the prompt and run the sink (reference latents + packed
        motion latents, zero timestep) through every layer, keeping its keys and values."""
        dtype = self.dtype
        ctx_BMD = self.embed_text(prompt_BLC)
        for i, block in enumerate(self.layers()):
            k, v = block.cross_attn.context_kv(ctx_BMD)
            cache.text_k[i], cache.text_v[i] = k, v
        ref = self.patch_embedding(ref_BC1HW.to(dtype)).flatten(2).transpose(1, 2)
        mot = self.frame_packer(motion_BCTHW.to(dtype))
        rows = self.trainable_cond_mask.weight
        x = torch.cat([ref + rows[1], mot + rows[2]], dim=1)
        B = x.shape[0]
        _, mod0 = self.time_modulation(torch.zeros(B, 1, device=x.device))
        rope = rope_fp16(cache.sink_rope_pos, self.cfg.head_dim)  # the reference unshifted
        kv = SinkPrefill(cache)
        for i, block in enumerate(self.layers()):
            x = block(x, mod0, rope, cache.text_kv(i), kv, i)
        cache.prefilled = True

    # -- per block -----------------------------------------------------------------------------

    def encode_audio(self, feats_BSAF: Tensor) -> AudioTokens:
        """One block's wav2vec2 hidden states (B, S, A, 4*frames_per_block) → its audio tokens.
        As the authors do, the block is encoded on its own, after `motion_frames` copies of
        its first frame (the causal convolutions then see no earlier audio)."""
        cfg = self.cfg
        pad = feats_BSAF[..., :1].expand(*feats_BSAF.shape[:-1], cfg.motion_frames)
        glob, local = self.casual_audio_encoder(torch.cat([pad, feats_BSAF], dim=-1))
        skip = cfg.motion_latent_frames
        return AudioTokens(glob[:, skip:, 0].to(self.dtype), local[:, skip:].to(self.dtype))

    def embed_block(self, x_BCTHW: Tensor, pose_BCTHW: Tensor | None) -> Tensor:
        dtype = self.dtype
        tok = self.patch_embedding(x_BCTHW.to(dtype))
        if pose_BCTHW is None:  # the authors feed zero latents: the encoder's bias alone
            tok = tok + cast(Tensor, self.cond_encoder.bias)[:, None, None, None]
        else:
            tok = tok + self.cond_encoder(pose_BCTHW.to(dtype))
        return tok.flatten(2).transpose(1, 2) + self.trainable_cond_mask.weight[0]

    def run_layers(
        self,
        x_BLD: Tensor,
        t_BT: Tensor,
        rope: Rope,
        audio: AudioTokens,
        cache: S2VCache,
        kv: KeyValues,
    ) -> Tensor:
        e_BTD, mod_BT6D = self.time_modulation(t_BT)
        injected = self.audio_injector.layer_ids
        for i, block in enumerate(self.layers()):
            x_BLD = block(x_BLD, mod_BT6D, rope, cache.text_kv(i), kv, i)
            if i in injected:
                x_BLD = self.audio_injector(i, x_BLD, audio)
        return self.head(x_BLD, e_BTD)

    def forward_block(
        self,
        x_BCTHW: Tensor,
        t_B: Tensor,
        audio: AudioTokens,
        cache: S2VCache,
        step: int,
        pose_BCTHW: Tensor | None = None,
        ref_distance: int | None = None,
    ) -> Tensor:
        """The flow (velocity) for one block's noisy latents at timestep t (0..1000), for
        sampling step `step` (its K/V go to that step's cache). `pose_BCTHW`: pose latents
        (the authors' inference passes none: zeros); `ref_distance`: see `sink_shift`."""
        B, _, T, H, W = x_BCTHW.shape
        cfg = self.cfg
        h, w = cache.grid
        if not cache.prefilled:
            raise RuntimeError("the cache holds no sink yet: call prefill(cache, ...) first")
        if not 0 <= step < cache.k.shape[0]:
            raise ValueError(f"step {step} outside the cache's {cache.k.shape[0]} steps")
        if (T, H, W) != (cfg.frames_per_block, h * cfg.patch_size[1], w * cfg.patch_size[2]):
            raise ValueError(
                f"a block is {cfg.frames_per_block} latent frames of the cache's "
                f"{h * cfg.patch_size[1]}x{w * cfg.patch_size[2]}; got {T} of {H}x{W}"
            )
        frame0 = cache.block * cfg.frames_per_block
        rope = rope_fp16(block_positions(frame0, T, h, w, x_BCTHW.device), cfg.head_dim)
        shift = self.sink_shift(frame0, ref_distance)
        kv = CachedStep(cache, step, shift, lambda: self.sink_rope(cache, shift))
        x = self.embed_block(x_BCTHW, pose_BCTHW)
        t_BT = t_B.reshape(-1, 1).float().expand(B, T)
        out = self.run_layers(x, t_BT, rope, audio, cache, kv)
        kv.finish()
        return self.unpatchify(out, (T, h, w)).to(x_BCTHW.dtype)

    def forward_masked(
        self,
        x_BCTHW: Tensor,
        t_BT: Tensor,
        audio: AudioTokens,
        cache: S2VCache,
        ref_distance: int | None = None,
    ) -> Tensor:
        """Every block from frame 0 at once, through a block-causal windowed mask: what the
        cached path computes when each block's K/V were written at the same step (tests)."""
        B, _, T, H, W = x_BCTHW.shape
        cfg = self.cfg
        h, w = cache.grid
        blocks = T // cfg.frames_per_block
        sink_ropes = [
            self.sink_rope(cache, self.sink_shift(b * cfg.frames_per_block, ref_distance))
            for b in range(blocks)
        ]
        kv = BlockCausalMask(cache, sink_ropes, cache.slots)
        rope = rope_fp16(block_positions(0, T, h, w, x_BCTHW.device), cfg.head_dim)
        out = self.run_layers(self.embed_block(x_BCTHW, None), t_BT.float(), rope, audio, cache, kv)
        return self.unpatchify(out, (T, h, w)).to(x_BCTHW.dtype)

    def unpatchify(self, x_BLK: Tensor, grid: tuple[int, int, int]) -> Tensor:
        T, h, w = grid
        pt, ph, pw = self.cfg.patch_size
        c = self.cfg.out_dim
        x = x_BLK.reshape(x_BLK.shape[0], T, h, w, pt, ph, pw, c)
        return x.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(x_BLK.shape[0], c, T * pt, h * ph, w * pw)
