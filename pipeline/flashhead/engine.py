"""The FlashHead family behind the engine seam (`pipeline.stream`).

A chunk is `chunk_frames` (33) video frames: the first `motion_latents` latent frames are
the previous chunk's last frames re-encoded (its motion, 5 frames for Pro), the rest are
new (28 for Pro). For each chunk, as the authors' stream mode does:

1. audio: wav2vec2 re-reads the last `audio_window_seconds` of audio (zeros before the
   stream began); each of the chunk's frames takes a 5-frame window of those features,
   clamped at the window's end (no audio past the chunk is read);
2. sampling: `steps` Euler-like steps of the DiT from fresh noise, the motion latents
   pinned at the front before every step, each step's clean estimate re-noised to the
   next timestep with fresh noise (the distilled model's sampler);
3. decode: the Wan 2.1 (Pro) or LTX-Video (Lite) VAE; colour correction against the
   reference; the new frames leave, the last motion frames are re-encoded for the next chunk.

Rolling memory: a stream keeps the reference's latents and colour statistics, the motion
latents and the audio the next window reads; nothing else outlives a chunk.

Legend: C latent channels, T latent frames, F video frames, h, w latent rows and columns,
H, W pixels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pipeline.clock import FPS, MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.errors import ConfigError
from pipeline.flashhead.color import ColorMatch
from pipeline.flashhead.framing import cover_and_crop
from pipeline.flashhead.weights import load_dit, release_paths
from pipeline.models.ltx.vae import LtxVae, load_ltx_vae
from pipeline.models.wan.dit import WanAudioDiT, wan_fp8_targets
from pipeline.models.wan.vae import WanVAE, load_wan_vae
from pipeline.models.wav2vec2 import SpeechFeatures
from pipeline.module import DTYPES
from pipeline.schedule import Chunk, ChunkPlan, StreamStep
from pipeline.stream import FrameBatch, no_prompt
from pipeline.windowed_stream import WindowedStream, to_uint8_frames


def model_dtype(cfg: FacecastConfig, device: torch.device) -> torch.dtype:
    """bf16 on a GPU, as the authors run it; fp32 on a CPU, where bf16 convolutions crawl."""
    if cfg.flashhead.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[cfg.flashhead.dtype]


def sampling_timesteps(steps: int, shift: float, device: torch.device) -> list[Tensor]:
    """The distilled sampler's timesteps (0..1000, then 0), shifted toward the noisy end:
    t' = shift·t / (1 + (shift − 1)·t) on t in [0, 1]."""
    if steps == 4:
        ts = [1000.0, 750.0, 500.0, 250.0]
    elif steps == 2:
        ts = [1000.0, 500.0]
    else:
        ts = [float(t) for t in np.linspace(1000, 1, steps, dtype=np.float32)]
    out = []
    for t in [*ts, 0.0]:
        u = torch.tensor([t], device=device) / 1000
        out.append(shift * u / (1 + (shift - 1) * u) * 1000)
    return out


def sample_chunk(
    dit: WanAudioDiT,
    noise_CTHW: Tensor,
    motion_CTHW: Tensor,
    ref_CTHW: Tensor,
    ctx_BTMD: Tensor,
    timesteps: list[Tensor],
    generator: torch.Generator,
) -> Tensor:
    """One chunk's latents from its noise: the hot path (no host syncs)."""
    x = noise_CTHW
    m = motion_CTHW.shape[1]
    for i in range(len(timesteps) - 1):
        x[:, :m] = motion_CTHW
        flow = dit(x[None], timesteps[i], ctx_BTMD, ref_CTHW[None])[0]
        t_now = (timesteps[i] / 1000).to(x.dtype)
        t_next = (timesteps[i + 1] / 1000).to(x.dtype)
        clean = x - flow * t_now
        fresh = torch.randn(clean.shape, dtype=x.dtype, device=x.device, generator=generator)
        x = (1 - t_next) * clean + t_next * fresh
    x[:, :m] = motion_CTHW
    return x


def window_indices(frames: int, end: int) -> Tensor:
    """(frames, 5) feature rows: each of the last `frames` frames before `end` with its
    neighbours ±2, clamped to the window [0, end)."""
    centre = torch.arange(end - frames, end)[:, None] + torch.arange(-2, 3)[None, :]
    return centre.clamp(0, end - 1)


def decode_passes(chunk_frames: int, stride: int, motion_latents: int, per_pass: int) -> list[int]:
    """Latent frames per decode pass after a chunk's first (which the VAE takes alone): up
    to the first latent frame with new video frames, then `per_pass` at a time (0: all the
    rest in one pass)."""
    rest = (chunk_frames - 1) // stride  # latent frames after the first
    if per_pass == 0:
        return [rest]
    first = min(rest, motion_latents)
    passes = [first]
    while sum(passes) < rest:
        passes.append(min(per_pass, rest - sum(passes)))
    return passes


@dataclass
class FlashHeadModels:
    dit: WanAudioDiT
    vae: WanVAE | LtxVae  # Pro's Wan 2.1 VAE, Lite's LTX-Video VAE
    speech: SpeechFeatures


class FlashHeadEngine:
    """The release's models, loaded once; every stream shares them."""

    def __init__(self, cfg: FacecastConfig, models: FlashHeadModels, device: torch.device):
        self.cfg = cfg
        self.models = models
        self.device = device
        self.dtype = model_dtype(cfg, device)
        self.offloader = None
        self.compiled = False
        self.precision = "default"
        self.warmup_seconds: float | None = None
        self.step_seconds: dict[str, float] | None = None
        self.startup = None
        self.warmup_steps = 3  # one chunk shape: the first step, then two steady ones
        fh = cfg.flashhead
        self.timesteps = sampling_timesteps(fh.steps, fh.shift, device)
        self.stride = cfg.vae_temporal_stride
        self.motion_frames = (fh.motion_latents - 1) * self.stride + 1
        self.new_frames = cfg.flashhead_new_frames
        per_pass = fh.decode_pass_latents
        if per_pass is None:
            per_pass = 2 if device.type == "cuda" else 0
        self.decode_passes = decode_passes(fh.chunk_frames, self.stride, fh.motion_latents, per_pass)

    @classmethod
    def load(cls, cfg: FacecastConfig, device: str = "cpu") -> FlashHeadEngine:
        fh = cfg.flashhead
        if fh.weights is None or fh.wav2vec is None:
            raise ConfigError(
                f"--model {cfg.name} needs --weights DIR (the release folder) and --wav2vec "
                "DIR (a facebook/wav2vec2-base-960h folder): README, 'Run a real model'"
            )
        dev = torch.device(device)
        dtype = model_dtype(cfg, dev)
        dit_dir, vae_path = release_paths(fh.weights, fh.variant)
        speech = SpeechFeatures(fh.wav2vec, dev)
        dit = load_dit(dit_dir, dev, dtype, speech.layers, speech.width)
        vae: WanVAE | LtxVae
        if fh.variant == "pro":
            vae = load_wan_vae(vae_path, dev, dtype, config=None)
        else:
            vae = load_ltx_vae(vae_path, dev, dtype)
        if dit.cfg.vae_stride[0] != cfg.vae_temporal_stride:
            raise ConfigError(
                f"{dit_dir / 'config.json'}: vae_stride {dit.cfg.vae_stride} is not the "
                f"{fh.variant} variant's"
            )
        return cls(cfg, FlashHeadModels(dit, vae, speech), dev)

    def stream_step(self, k: int) -> StreamStep:
        return ChunkPlan(self.cfg.schedule).step(k, 1, 0)

    def new_stream(
        self,
        reference_rgb,
        seed: int = 0,
        sinks: list[Callable[[FrameBatch], None]] | None = None,
        prompt: str | None = None,
    ) -> FlashHeadStream:
        no_prompt(self.cfg, prompt)
        if not isinstance(reference_rgb, np.ndarray):  # a prepared photo: its framed image
            reference_rgb = reference_rgb.framed
        return FlashHeadStream(self, reference_rgb, seed, sinks or [])

    def warmup_reference(self) -> np.ndarray:
        v = self.cfg.video
        return np.full((v.height, v.width, 3), 127, np.uint8)

    def warmup(self, seed: int = 0) -> float:
        from pipeline.warmup import warm_up

        return warm_up(self, seed)

    def run_every_shape(self, seed: int = 0) -> None:
        from pipeline.warmup import warm_session

        warm_session(self, seed, timed=False)

    def fp8_targets(self, scaling: str) -> list[tuple[torch.nn.Module, str]]:
        """(parent, attribute) of the linears FP8 replaces: the blocks' token-wise ones."""
        return wan_fp8_targets(self.models.dit.audio_blocks(), scaling)

    def compile(self, mode: str | None = None) -> int:
        """torch.compile each DiT block and, on a GPU, the VAE's decoder (Pro: the causal
        decoder's norms, SiLUs and look-backs fused in front of cuDNN's convolutions);
        returns how many blocks were compiled."""
        blocks = self.models.dit.audio_blocks()
        for block in blocks:
            block.forward = torch.compile(block.forward, mode=mode)  # type: ignore[method-assign]
        if self.device.type == "cuda":
            vae = self.models.vae
            if isinstance(vae, WanVAE):
                vae.causal_decoder.compile(mode)
            else:
                vae.network.decoder.forward = torch.compile(vae.network.decoder.forward, mode=mode)
        self.compiled = True
        return len(blocks)


class FlashHeadStream(WindowedStream):
    """One open-ended stream of one reference: push audio, collect frames in order."""

    def __init__(
        self,
        engine: FlashHeadEngine,
        reference_rgb: np.ndarray,
        seed: int,
        sinks: list[Callable[[FrameBatch], None]],
    ) -> None:
        fh = engine.cfg.flashhead
        super().__init__(engine.cfg, fh.audio_window_seconds * MODEL_RATE, sinks)
        self.engine = engine
        self.generator = torch.Generator(device=engine.device).manual_seed(seed)
        t = time.perf_counter()
        v, dev, dtype = self.cfg.video, engine.device, engine.dtype
        with torch.inference_mode():
            image = np.array(cover_and_crop(reference_rgb, v.width, v.height))
            ref = torch.from_numpy(image).to(dev).permute(2, 0, 1)[None, :, None].to(dtype)
            ref = (ref / 255 - 0.5) * 2  # (1, 3, 1, H, W) in [-1, 1], in the model's dtype
            self.color = ColorMatch(ref[:, :, 0], fh.color_correction)
            self.ref_lat: Tensor | None = self._encode(ref.repeat(1, 1, fh.chunk_frames, 1, 1))[0]
            self.motion: Tensor | None = self.ref_lat[:, :1].clone()
        self.times.add("init", time.perf_counter() - t)

    def audio_end(self, k: int) -> int:
        """Chunk k's audio ends with its last frame (no lookahead)."""
        return self.plan.n_end(k) * MODEL_SAMPLES_PER_FRAME

    def _audio(self, k: int) -> Tensor:
        """(1, F, 5, layers, width): the chunk's frames' feature windows."""
        audio, _ = self.window_audio(k)
        window_frames = self.window * FPS // MODEL_RATE
        feats = self.engine.models.speech.frames(audio, window_frames)
        idx = window_indices(self.cfg.flashhead.chunk_frames, window_frames).to(feats.device)
        return feats[idx][None]

    def _encode(self, video_B3FHW: Tensor) -> Tensor:
        """Latents of pixels. Lite's LTX VAE samples its posterior, as the authors' code
        does (they draw from torch's global generator; a stream draws from its own)."""
        vae = self.engine.models.vae
        if isinstance(vae, LtxVae):
            return vae.encode(video_B3FHW, sample=True, generator=self.generator)
        return vae.encode(video_B3FHW)

    def make_chunk(self, k: int, chunk: Chunk) -> Iterator[np.ndarray]:
        """The chunk's new frames: Pro's in pieces, each as soon as its latent frames are
        decoded (the first new ones after a short pass), Lite's at once."""
        if self.ref_lat is None or self.motion is None:
            raise RuntimeError("the stream is closed")
        lat = self._sample(k)
        vae, engine = self.engine.models.vae, self.engine
        if isinstance(vae, LtxVae):
            yield self._finish_chunk(vae.decode(lat[None]))
            return
        t = time.perf_counter()
        with torch.inference_mode():
            passes = vae.stream().frames(lat[None], passes=engine.decode_passes)
        seen, tail = 0, list[Tensor]()  # video frames decoded so far; the last ones, for the motion
        while True:
            with torch.inference_mode():
                pixels = next(passes, None)
                if pixels is None:
                    break
                video = self.color(pixels)  # (1, 3, n, H, W) in [-1, 1]
                lo = max(0, engine.motion_frames - seen)
                seen += video.shape[2]
                tail = [*tail, video][-2:]  # a pass gives 4+ frames: two hold the motion's 5
                frames = to_uint8_frames(video[0, :, lo:]) if lo < video.shape[2] else None
            if frames is not None:
                self.times.add("decode", time.perf_counter() - t)
                yield frames
                t = time.perf_counter()
        self.times.add("decode", time.perf_counter() - t)
        t = time.perf_counter()
        with torch.inference_mode():
            self.motion = self._encode(torch.cat(tail, dim=2)[:, :, -engine.motion_frames :])[0]
        self.times.add("encode", time.perf_counter() - t)

    @torch.inference_mode()
    def _sample(self, k: int) -> Tensor:
        """Chunk k's latents (C, T, h, w): its audio's features, then the DiT's steps."""
        assert self.ref_lat is not None and self.motion is not None
        engine = self.engine
        models, dev, dtype = engine.models, engine.device, engine.dtype
        t = time.perf_counter()
        audio = self._audio(k).to(dev)
        self.times.add("audio", time.perf_counter() - t)
        t = time.perf_counter()
        ctx = models.dit.project_audio(audio)
        C, T, h, w = self.ref_lat.shape
        noise = torch.randn((C, T, h, w), dtype=dtype, device=dev, generator=self.generator)
        lat = sample_chunk(
            models.dit, noise, self.motion, self.ref_lat, ctx, engine.timesteps, self.generator
        )
        self.times.add("dit", time.perf_counter() - t)
        return lat

    @torch.inference_mode()
    def _finish_chunk(self, decoded_B3FHW: Tensor) -> np.ndarray:
        """A whole chunk's pixels: colour, the motion for the next chunk, the new frames."""
        t = time.perf_counter()
        video = self.color(decoded_B3FHW)
        self.times.add("decode", time.perf_counter() - t)
        t = time.perf_counter()
        self.motion = self._encode(video[:, :, -self.engine.motion_frames :])[0]
        self.times.add("encode", time.perf_counter() - t)
        return to_uint8_frames(video[0, :, self.engine.motion_frames :])

    def release(self) -> None:
        self.ref_lat = None
        self.motion = None
