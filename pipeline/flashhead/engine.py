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

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pipeline.batching import StepBatcher
from pipeline.clock import FPS, MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.errors import ConfigError
from pipeline.faces.framing import cover_and_crop
from pipeline.family_engine import EngineBase
from pipeline.flashhead.color import ColorMatch, match_colors
from pipeline.flashhead.dit import WanAudioDiT
from pipeline.flashhead.sampling import draw, sample_chunks, sampling_timesteps, window_indices
from pipeline.flashhead.weights import load_dit, release_paths
from pipeline.kernels.fp8_attention import fp8_refusal
from pipeline.models.attention import say_fallback
from pipeline.models.encoders.wav2vec2 import SpeechFeatures
from pipeline.models.ltx.vae import LtxVae, load_ltx_vae
from pipeline.models.wan.layers import wan_fp8_targets
from pipeline.models.wan.vae import WanVAE, load_wan_vae
from pipeline.module import DTYPES
from pipeline.schedule import Chunk, ChunkPlan, StreamStep
from pipeline.stream import FrameBatch, no_prompt, stage_of
from pipeline.windowed_stream import HostFrames, WindowedStream, to_uint8_frames

log = logging.getLogger("facecast.flashhead")

REFERENCES_KEPT = 8  # pictures whose latents an engine keeps (~1 MB each for Pro at 512x512)


def model_dtype(cfg: FacecastConfig, device: torch.device) -> torch.dtype:
    """bf16 on a GPU, as the authors run it; fp32 on a CPU, where bf16 convolutions crawl."""
    if cfg.flashhead.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[cfg.flashhead.dtype]


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


class FlashHeadEngine(EngineBase):
    """The release's models, loaded once; every stream shares them."""

    warmup_steps = 3  # one chunk shape: the first step, then two steady ones

    def __init__(self, cfg: FacecastConfig, models: FlashHeadModels, device: torch.device):
        super().__init__(cfg, device)
        self.models = models
        self.dtype = model_dtype(cfg, device)
        fh = cfg.flashhead
        self.timesteps = sampling_timesteps(fh.steps, fh.shift, device)
        self.stride = fh.temporal_stride
        self.motion_frames = fh.motion_frames
        self.new_frames = fh.new_frames
        per_pass = fh.decode_pass_latents
        if per_pass is None:
            per_pass = 2 if device.type == "cuda" else 0
        self.decode_passes = decode_passes(
            fh.chunk_frames, self.stride, fh.motion_latents, per_pass
        )
        self.match_colors = match_colors  # compiled on a GPU (`compile`)
        # each chunk frame's five feature rows, the same every step: on the device once (a
        # copy from pageable memory each step would hold the host until the GPU caught up)
        window_frames = fh.audio_window_seconds * FPS
        self.window_rows = window_indices(fh.chunk_frames, window_frames).to(device)
        self.chunk_seconds = self.new_frames / FPS  # the play time one step makes
        self.batcher: StepBatcher[tuple[FlashHeadStream, int], np.ndarray] = StepBatcher(
            self.run_batch, fh.batch_streams, name="flashhead-steps"
        )
        # picture digest -> its latents, newest last (`reference_latents`)
        self._reference_latents: OrderedDict[str, Tensor] = OrderedDict()
        self._reference_lock = threading.Lock()
        self.place_self_attention()

    def place_self_attention(self) -> None:
        """cuDNN's FP8 attention where `flashhead.attention` asks for it (fp8, or auto beside
        FP8 linears) and the kernel can run here: each block then quantises its q, k and v
        in its own (compiled) code. Elsewhere the exact SDPA; the reason said once in the log
        where fp8 was asked for by name. At load, and again once `--precision fp8` has
        swapped the linears (`pipeline.precision.apply_fp8`)."""
        asked = self.cfg.flashhead.attention
        fp8_linears = self.precision != "default"
        wanted = asked == "fp8" or (asked == "auto" and fp8_linears)
        refusal = None
        if wanted:
            dit = self.models.dit.cfg
            q = torch.empty(1, dit.num_heads, 1, dit.head_dim, device=self.device, dtype=self.dtype)
            refusal = fp8_refusal(q)
            if refusal is not None and asked == "fp8":
                say_fallback("fp8", refusal)
        fp8 = wanted and refusal is None
        for block in self.models.dit.audio_blocks():
            block.self_attn.fp8_inputs = fp8
        self.kernels["self_attention"] = "fp8" if fp8 else "sdpa"
        if wanted:  # `auto` beside FP8 linears says why it stays exact (the speed it costs)
            why = f" ({refusal})" if refusal is not None and asked == "auto" else ""
            log.info("self-attention: %s%s", "cuDNN's FP8 kernel" if fp8 else "exact SDPA", why)

    def precision_applied(self) -> None:
        self.place_self_attention()  # `auto`: the attention in FP8 beside FP8 linears

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
        speech = SpeechFeatures(fh.wav2vec, dev, graphs=cfg.runtime.speech_graphs)
        dit = load_dit(dit_dir, dev, dtype, speech.layers, speech.width)
        vae: WanVAE | LtxVae
        if fh.variant == "pro":
            vae = load_wan_vae(vae_path, dev, dtype, config=None)
        else:
            vae = load_ltx_vae(vae_path, dev, dtype)
        if dit.cfg.vae_stride[0] != fh.temporal_stride:
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

    def reference_latents(self, image: np.ndarray, encode: Callable[[], Tensor]) -> Tensor:
        """The latents of a framed reference, encoded once per picture and kept for the
        next streams of it. Pro encodes the picture as 33 still frames with the Wan VAE,
        ~0.2 s on the H200 that a call's first step waited for; the server encodes its own
        reference before its first call (`realtime.service`). Lite's encode samples from
        each stream's own generator, so each stream encodes its own."""
        if not isinstance(self.models.vae, WanVAE):
            return encode()
        key = f"{image.shape}:{hashlib.blake2b(image.tobytes(), digest_size=16).hexdigest()}"
        with self._reference_lock:
            if key in self._reference_latents:
                self._reference_latents.move_to_end(key)
                return self._reference_latents[key]
        latents = encode()
        with self._reference_lock:
            self._reference_latents[key] = latents
            while len(self._reference_latents) > REFERENCES_KEPT:
                self._reference_latents.popitem(last=False)
        return latents

    def fp8_targets(self, scaling: str) -> list[tuple[torch.nn.Module, str]]:
        """(parent, attribute) of the linears FP8 replaces: the blocks' token-wise ones, and
        their attention output projections where `flashhead.fp8_outputs` says so."""
        blocks = self.models.dit.audio_blocks()
        return wan_fp8_targets(blocks, scaling, outputs=self.cfg.flashhead.fp8_outputs)

    def compile(self, mode: str | None = None) -> int:
        """torch.compile each DiT block and, on a GPU, the VAE's decoder (Pro: the causal
        decoder, one graph a pass: its norms, SiLUs, look-backs, residual adds and shuffles
        fused between cuDNN's convolutions; and its encoder, channels-last, one graph a pass
        length); returns how many blocks were compiled."""
        blocks = self.models.dit.audio_blocks()
        for block in blocks:
            block.forward = torch.compile(block.forward, mode=mode)  # type: ignore[method-assign]
        # Latents kept from before (FP8's calibration session encodes the warm-up picture)
        # came from the eager encoder: kept, the warm-up's streams would reuse them and never
        # compile the 33-frame reference encode, which the first new picture then paid for
        # in its call (3.5 s of the H200 bench's first step).
        with self._reference_lock:
            self._reference_latents.clear()
        if self.device.type == "cuda":
            vae = self.models.vae
            self.match_colors = torch.compile(match_colors, mode=mode, dynamic=False)
            if isinstance(vae, WanVAE):
                vae.causal_decoder.compile(mode, whole_pass=True)
                vae.compile_encoder(mode)  # the motion re-encode, every step
            else:
                vae.network.decoder.forward = torch.compile(vae.network.decoder.forward, mode=mode)
        self.compiled = True
        return len(blocks)

    def run_batch(
        self, jobs: list[tuple[FlashHeadStream, int]]
    ) -> Iterator[list[np.ndarray | None]]:
        """One step of each (stream, chunk k) together: audio features, the DiT's steps and
        the decode over the batch; yields each decode pass's new frames, one entry a stream.
        Each stream's numbers (its noise, colour, motion) are its own, as if it ran alone."""
        # a stream's first chunk carries one latent frame of motion (the reference's), later
        # ones `motion_latents`: the two run as batches of their own, one after the other
        groups: dict[tuple, list[int]] = {}
        for i, (stream, _) in enumerate(jobs):
            groups.setdefault(tuple(stream.live_motion().shape), []).append(i)
        for members in groups.values():
            for pieces in self._run_group([jobs[i] for i in members]):
                out: list[np.ndarray | None] = [None] * len(jobs)
                for i, piece in zip(members, pieces, strict=True):
                    out[i] = piece
                yield out

    def _run_group(
        self, jobs: list[tuple[FlashHeadStream, int]]
    ) -> Iterator[list[np.ndarray | None]]:
        streams = [s for s, _ in jobs]
        with torch.inference_mode():
            lat = self._sample(jobs)
            vae = self.models.vae
            if isinstance(vae, LtxVae):
                decoded = vae.decode(lat)
                yield [s.finish_chunk(decoded[i : i + 1]) for i, s in enumerate(streams)]
                return
            yield from self._decode_in_passes(streams, lat)

    def _sample(self, jobs: list[tuple[FlashHeadStream, int]]) -> Tensor:
        """The batch's latents (B, C, T, h, w): each chunk's audio features, the DiT's steps."""
        streams = [s for s, _ in jobs]
        times = [s.times for s in streams]
        with stage_of(times, "audio"):
            windows = [s.window_audio(k)[0] for s, k in jobs]
            audio = self._audio_features(windows).to(self.device)
        with stage_of(times, "dit"):
            ref = torch.stack([s.live_reference() for s in streams])
            motion = torch.stack([s.live_motion() for s in streams])
            ctx = self.models.dit.project_audio(audio)
            gens = [s.generator for s in streams]
            noise = torch.stack([draw(ref.shape[1:], ref, g) for g in gens])
            lat = sample_chunks(self.models.dit, noise, motion, ref, ctx, self.timesteps, gens)
        return lat

    def _audio_features(self, windows: list[np.ndarray]) -> Tensor:
        """(B, F, 5, layers, width): each chunk's frames' feature windows, wav2vec2 over the
        batch's audio windows at once."""
        window_frames = self.cfg.flashhead.audio_window_seconds * FPS
        feats = self.models.speech.batch_frames(windows, window_frames)
        return feats[:, self.window_rows]

    def _decode_in_passes(
        self, streams: list[FlashHeadStream], lat_BCThw: Tensor
    ) -> Iterator[list[np.ndarray | None]]:
        """Pro: the Wan VAE's passes over the batch; the new frames of each pass, coloured
        per stream; the last motion frames re-encoded for every stream at once, queued
        before the last pass's frames are handed on."""
        assert isinstance(self.models.vae, WanVAE)
        t = time.perf_counter()
        passes = self.models.vae.stream().frames(lat_BCThw, passes=self.decode_passes)
        seen, tail = 0, list[Tensor]()  # video frames decoded so far; the last ones, for the motion
        strength = self.cfg.flashhead.color_correction
        ref_mean = torch.cat([s.color.mean for s in streams])
        ref_std = torch.cat([s.color.std for s in streams])
        # each pass's frames go to the host while the next pass runs: a pass is handed on
        # once the next one is queued, so the GPU never waits for the host between them
        on_the_way: list[HostFrames] | None = None
        for pixels in passes:
            video = pixels
            if strength > 0:  # each stream's frames to its own reference's colours
                video = self.match_colors(pixels, ref_mean, ref_std, strength)
            lo = max(0, self.motion_frames - seen)
            seen += video.shape[2]
            tail = [*tail, video][-2:]  # a pass gives 4+ frames: two hold the motion's 5
            if lo >= video.shape[2]:
                continue
            queued = [HostFrames(v[:, lo:]) for v in video]
            if on_the_way is not None:
                _add_time(streams, "decode", t)
                yield list[np.ndarray | None]([frames.numpy() for frames in on_the_way])
                t = time.perf_counter()
            on_the_way = queued
        _add_time(streams, "decode", t)
        # The motion re-encode is queued before the last pass's frames are waited for: the
        # GPU runs it while the host takes those frames and hands them on, and is still busy
        # when the next step's work arrives (waited for first, the GPU sat idle from the last
        # pass to the encode's launch, and again from the encode to the next step's).
        with stage_of([s.times for s in streams], "encode"):
            motion = self.models.vae.encode(torch.cat(tail, dim=2)[:, :, -self.motion_frames :])
            for i, s in enumerate(streams):
                s.motion = motion[i]
        if on_the_way is not None:
            t = time.perf_counter()
            pieces: list[np.ndarray | None] = [frames.numpy() for frames in on_the_way]
            _add_time(streams, "decode", t)
            yield pieces


def _add_time(streams: list[FlashHeadStream], stage: str, since: float) -> None:
    """A batch's stage time is each of its streams' (each waited that long for it). By hand
    where a stage yields its pieces midway (`stage_of` would count the consumer's time)."""
    seconds = time.perf_counter() - since
    for s in streams:
        s.times.add(stage, seconds)


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
        with self.times.stage("init"):
            v, dev, dtype = self.cfg.video, engine.device, engine.dtype
            with torch.inference_mode():
                image = np.array(cover_and_crop(reference_rgb, v.width, v.height))
                ref = torch.from_numpy(image).to(dev).permute(2, 0, 1)[None, :, None].to(dtype)
                ref = (ref / 255 - 0.5) * 2  # (1, 3, 1, H, W) in [-1, 1], in the model's dtype
                self.color = ColorMatch(ref[:, :, 0], fh.color_correction)
                self.ref_lat: Tensor | None = engine.reference_latents(
                    image, lambda: self._encode(ref.repeat(1, 1, fh.chunk_frames, 1, 1))[0]
                )
                self.motion: Tensor | None = self.ref_lat[:, :1].clone()

    def audio_end(self, k: int) -> int:
        """Chunk k's audio ends with its last frame (no lookahead)."""
        return self.plan.n_end(k) * MODEL_SAMPLES_PER_FRAME

    def live_reference(self) -> Tensor:
        if self.ref_lat is None:
            raise RuntimeError("the stream is closed")
        return self.ref_lat

    def live_motion(self) -> Tensor:
        if self.motion is None:
            raise RuntimeError("the stream is closed")
        return self.motion

    def _encode(self, video_B3FHW: Tensor) -> Tensor:
        """Latents of pixels. Lite's LTX VAE samples its posterior, as the authors' code
        does (they draw from torch's global generator; a stream draws from its own)."""
        vae = self.engine.models.vae
        if isinstance(vae, LtxVae):
            return vae.encode(video_B3FHW, sample=True, generator=self.generator)
        return vae.encode(video_B3FHW)

    def make_chunk(self, k: int, chunk: Chunk) -> Iterator[np.ndarray]:
        """The chunk's new frames, made in a batch with the other streams' steps that are
        waiting (`FlashHeadEngine.run_batch`): Pro's in pieces, each as soon as its latent
        frames are decoded, Lite's at once."""
        if self.ref_lat is None or self.motion is None:
            raise RuntimeError("the stream is closed")
        yield from self.engine.batcher.run((self, k))

    def finish_chunk(self, decoded_B3FHW: Tensor) -> np.ndarray:
        """Lite: a whole chunk's pixels: colour, the motion for the next chunk (sampled from
        the stream's own generator), the new frames."""
        with self.times.stage("decode"):
            video = self.color(decoded_B3FHW)
        with self.times.stage("encode"):
            self.motion = self._encode(video[:, :, -self.engine.motion_frames :])[0]
        return to_uint8_frames(video[0, :, self.engine.motion_frames :])

    def release(self) -> None:
        self.ref_lat = None
        self.motion = None
