"""The LiveAvatar family behind the engine seam (`pipeline.stream`).

LiveAvatar is Wan2.2-S2V-14B with the Live-Avatar LoRA merged in, run block-causally: the
video is made in blocks of 3 latent frames (12 video frames, 0.48 s), each denoised in 4
Euler steps while attending to the reference's *sink* and a rolling KV cache of the last
12 latent frames (`pipeline.models.wan.s2v`). Per stream, as the authors' streaming script
does (`infinite_inference_single_gpu.sh`):

1. start: the reference is scaled to cover the frame and centre-cropped; its latents (the
   second latent of a 5-frame still clip) and the motion latents (a 73-frame still clip, 19
   latents) go into the sink with the prompt's umT5 features, once;
2. each block: wav2vec2-large re-reads the last `audio_window_seconds` of audio (plus
   `audio_lookahead_frames` past the block) and the block's 12 frames take their features;
   4 Euler steps from fresh noise, each writing its keys and values into its own cache;
3. decode: the Wan 2.1 VAE carries its causal cache from block to block, warmed at start
   with the motion latents (the first block decodes as the authors' first clip does).

Where Facecast differs from the authors' script: they decode and re-encode whole 48-frame
clips (19 motion latents in front of each, the last 73 frames re-encoded for the next) after
the DiT is done, and drop the first clip's first 3 frames; here each block's latents are
decoded once, as they come, and every frame is kept, so frame n stays the frame of audio
[40n, 40n + 40) ms. The reference's RoPE distance, which they draw at random on every forward
(unseeded), is fixed (`liveavatar.ref_distance`).

Precision: under `--precision fp8` or `fp8-fast` the layers' linears run in float8, and (with
`liveavatar.attention` and `kv_cache` left `auto`) so does the self-attention: cuDNN's FP8
kernel over a cache kept in e4m3 (`place_self_attention`).

Memory: the weights (about 34 GB in bf16 at 14B) and one stream's cache (about 51 GB at
704x384 in bf16, half that in e4m3) stay on the GPU; the umT5 encoder waits in host memory
and visits the GPU for a prompt it has not seen. Nothing grows with the stream's length.

Legend: C latent channels, T latent frames, F video frames, h, w latent rows and columns,
H, W pixels, S wav2vec2 hidden states, A its width.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pipeline.clock import FPS, MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.errors import CheckpointError, ConfigError
from pipeline.faces.framing import cover_and_crop
from pipeline.family_engine import EngineBase
from pipeline.kernels.fp8_attention import fp8_refusal
from pipeline.liveavatar.config import self_attention
from pipeline.liveavatar.s2v_weights import load_published
from pipeline.liveavatar.weights import read_merged_state, read_transformer_config, release_paths
from pipeline.models.encoders.s2v_speech import S2VSpeechFeatures, to_feature_rate, to_video_frames
from pipeline.models.encoders.umt5 import PromptEncoder
from pipeline.models.wan.layers import wan_fp8_targets
from pipeline.models.wan.s2v import S2VConfig, S2VTransformer, euler_sigmas
from pipeline.models.wan.s2v_cache import S2VCache
from pipeline.models.wan.vae import WanDecodeStream, WanVAE, load_wan_vae
from pipeline.module import DTYPES
from pipeline.schedule import Chunk, ChunkPlan, StreamStep
from pipeline.side_stream import SideStream
from pipeline.stream import FrameBatch
from pipeline.windowed_stream import WindowedStream, to_uint8_frames

log = logging.getLogger("facecast.liveavatar")

REFERENCE_CLIP_FRAMES = 5  # the still clip the reference latent is encoded from (its 2nd)
PROMPTS_KEPT = 16  # umT5 features of this many recent prompts stay cached


def model_dtype(cfg: FacecastConfig, device: torch.device) -> torch.dtype:
    """bf16 on a GPU, as the authors run it; fp32 on a CPU, where bf16 crawls."""
    if cfg.liveavatar.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[cfg.liveavatar.dtype]


@dataclass
class LiveAvatarModels:
    transformer: S2VTransformer
    vae: WanVAE
    speech: S2VSpeechFeatures
    prompts: PromptEncoder  # umT5-XXL: in host memory between prompts


class LiveAvatarEngine(EngineBase):
    """The release's models, loaded once; a stream holds its own KV cache."""

    warmup_steps = 2  # one block shape: the first block (empty cache), then a later one

    def __init__(self, cfg: FacecastConfig, models: LiveAvatarModels, device: torch.device):
        super().__init__(cfg, device)
        self.models = models
        self.dtype = model_dtype(cfg, device)
        la = cfg.liveavatar
        timesteps, sigmas = euler_sigmas(la.steps, la.shift)
        self.timesteps, self.sigmas = timesteps.to(device), sigmas.to(device)
        self._prompt_features: OrderedDict[str, Tensor] = OrderedDict()
        self.side_stream = SideStream(device)  # where a block decodes beside the next's DiT
        self.kv_cache = "model"  # the streams' cache dtype, set with the attention below
        self.place_self_attention()

    def place_self_attention(self) -> None:
        """Each layer's self-attention kernel and the streams' KV cache dtype, `auto`
        resolved for the linears' precision (`self_attention`): at load, and again once
        `--precision fp8` has swapped the linears (`pipeline.precision.apply_fp8`)."""
        s2v = self.models.transformer.cfg
        head_dim = s2v.dim // s2v.num_heads
        q = torch.empty(1, s2v.num_heads, 1, head_dim, device=self.device, dtype=self.dtype)
        attention, self.kv_cache = self_attention(
            self.cfg.liveavatar, self.precision != "default", fp8_refusal(q)
        )
        for layer in self.models.transformer.layers():  # the self-attention over the cache
            layer.self_attn.attend.backend = attention
            # cuDNN's FP8 kernel reading the FP8 cache: the queries quantised where they are made
            layer.self_attn.fp8_queries = attention == "fp8" and self.kv_cache == "fp8"
        cache = "e4m3" if self.kv_cache == "fp8" else str(self.dtype).removeprefix("torch.")
        self.kernels |= {"self_attention": attention, "kv_cache": cache}
        log.info("self-attention %s over a KV cache in %s", attention, cache)

    @classmethod
    def load(cls, cfg: FacecastConfig, device: str = "cpu") -> LiveAvatarEngine:
        la = cfg.liveavatar
        if la.weights is None or la.lora is None:
            raise ConfigError(
                f"--model {cfg.name} needs --weights DIR (the Wan2.2-S2V-14B folder) and "
                "--lora FILE (the Live-Avatar LoRA): README, 'Run a real model'"
            )
        dev = torch.device(device)
        dtype = model_dtype(cfg, dev)
        paths = release_paths(la.weights)
        transformer = load_transformer(paths.root, la.lora, dev, dtype)
        block = transformer.cfg.frames_per_block * cfg.vae_temporal_stride
        if block != cfg.schedule.chunk_latents:
            raise ConfigError(
                f"{paths.config}: blocks of {transformer.cfg.frames_per_block} latent frames "
                f"make {block} video frames, the config's schedule {cfg.schedule.chunk_latents}"
            )
        vae = load_wan_vae(paths.vae, dev, dtype, config=None)
        speech = S2VSpeechFeatures(
            la.wav2vec or paths.wav2vec, dev, dtype, graphs=cfg.runtime.speech_graphs
        )
        s2v = transformer.cfg
        if (speech.num_states, speech.width) != (s2v.audio_layers, s2v.audio_dim):
            raise CheckpointError(
                f"{la.wav2vec or paths.wav2vec}: {speech.num_states} hidden states of "
                f"{speech.width}, but the transformer in {paths.root} reads "
                f"{s2v.audio_layers} of {s2v.audio_dim} (wav2vec2-large-xlsr-53's)"
            )
        prompts = PromptEncoder(paths.t5, paths.tokenizer, "cpu", prompt_dtype(dev))
        engine = cls(cfg, LiveAvatarModels(transformer, vae, speech, prompts), dev)
        engine.prompt_features(la.prompt)  # the default prompt's, cached before any session
        return engine

    # -- the prompt ------------------------------------------------------------------------
    def prompt_features(self, prompt: str) -> Tensor:
        """(1, tokens, 4096) umT5 features of `prompt`, from the cache or encoded now: the
        encoder comes to the engine's device for it and goes back to host memory after."""
        cached = self._prompt_features.get(prompt)
        if cached is not None:
            self._prompt_features.move_to_end(prompt)
            return cached
        t = time.perf_counter()
        encoder = self.models.prompts
        encoder.to(self.device)
        try:
            features = encoder.encode([prompt])[0][None].to(self.dtype)
        finally:
            encoder.to("cpu")
        self._prompt_features[prompt] = features
        while len(self._prompt_features) > PROMPTS_KEPT:
            self._prompt_features.popitem(last=False)
        log.info(
            "prompt of %d tokens encoded in %.2f s", features.shape[1], time.perf_counter() - t
        )
        return features

    # -- the engine seam -------------------------------------------------------------------
    def stream_step(self, k: int) -> StreamStep:
        return ChunkPlan(self.cfg.schedule).step(k, 1, self.cfg.lookahead_frames)

    def new_stream(
        self,
        reference_rgb,
        seed: int = 0,
        sinks: list[Callable[[FrameBatch], None]] | None = None,
        prompt: str | None = None,
    ) -> LiveAvatarStream:
        if not isinstance(reference_rgb, np.ndarray):  # a prepared photo: its framed image
            reference_rgb = reference_rgb.framed
        features = self.prompt_features(prompt or self.cfg.liveavatar.prompt)
        return LiveAvatarStream(self, reference_rgb, seed, sinks or [], features)

    def fp8_targets(self, scaling: str) -> list[tuple[torch.nn.Module, str]]:
        """(parent, attribute) of the linears FP8 replaces: each layer's token-wise ones,
        and its attention output projections where `liveavatar.fp8_outputs` says so."""
        layers = self.models.transformer.layers()
        return wan_fp8_targets(layers, scaling, outputs=self.cfg.liveavatar.fp8_outputs)

    def precision_applied(self) -> None:
        self.place_self_attention()  # `auto`: the attention in FP8 beside FP8 linears

    def compile(self, mode: str | None = None) -> int:
        """torch.compile each layer's dense work before and after its KV cache and, on a
        GPU, the VAE's decoder; returns how many layers were compiled. The cache's slot and
        length change from block to block as Python numbers: they stay outside the graphs,
        with the attention (the project's backend, not traced), so the graphs are made at
        the sink's shape and at a block's, once for every layer, and no later block
        recompiles (tests/test_liveavatar_engine.py counts them). The layers' mode is
        `mode` if given, else `liveavatar.compile_mode`."""
        configured = self.cfg.liveavatar.compile_mode
        layer_mode = mode or (None if configured == "default" else configured)
        layers = self.models.transformer.layers()
        for layer in layers:
            layer.before_attention = torch.compile(  # type: ignore[method-assign]
                layer.before_attention, mode=layer_mode, dynamic=False
            )
            layer.after_attention = torch.compile(  # type: ignore[method-assign]
                layer.after_attention, mode=layer_mode, dynamic=False
            )
        if self.device.type == "cuda":
            self.models.vae.causal_decoder.compile(mode, whole_pass=True)
        self.compiled = True
        return len(layers)


def prompt_dtype(device: torch.device) -> torch.dtype:
    """umT5 runs in bf16 on a GPU (as published), fp32 on a CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_transformer(
    root: Path, lora: str, device: torch.device, dtype: torch.dtype
) -> S2VTransformer:
    """The release's S2V transformer with the LoRA merged in (on `device`: the 14B model's
    ~400 merges are minutes on a CPU, a second on a GPU), strictly by the published names."""
    cfg = S2VConfig.from_release(read_transformer_config(root))
    state = read_merged_state(root, lora, device)
    # how many wav2vec2 states it weighs is fixed in the authors' code (25), not config.json
    weights = state.get("casual_audio_encoder.weights")
    if weights is not None and weights.dim() == 4:
        cfg = dataclasses.replace(cfg, audio_layers=weights.shape[1])
    with torch.device("meta"):
        model = S2VTransformer(cfg)
    model.to(dtype=dtype).to_empty(device=device)
    load_published(model, state, root)
    del state
    return model.eval().requires_grad_(False)


class LiveAvatarStream(WindowedStream):
    """One open-ended stream of one reference: push audio, collect frames in order."""

    def __init__(
        self,
        engine: LiveAvatarEngine,
        reference_rgb: np.ndarray,
        seed: int,
        sinks: list[Callable[[FrameBatch], None]],
        prompt_features: Tensor,
    ) -> None:
        la = engine.cfg.liveavatar
        super().__init__(engine.cfg, round(la.audio_window_seconds * MODEL_RATE), sinks)
        self.engine = engine
        self.lookahead = self.cfg.lookahead_frames * MODEL_SAMPLES_PER_FRAME
        self.generator = torch.Generator(device=engine.device).manual_seed(seed)
        with self.times.stage("init"):
            v, dev, dtype = self.cfg.video, engine.device, engine.dtype
            models = engine.models
            s2v = models.transformer.cfg
            with torch.inference_mode():
                image = np.array(cover_and_crop(reference_rgb, v.width, v.height))
                ref = torch.from_numpy(image).to(dev).permute(2, 0, 1)[None, :, None].to(dtype)
                ref = (ref / 255 - 0.5) * 2  # (1, 3, 1, H, W) in [-1, 1]
                ref_lat = models.vae.encode(ref.repeat(1, 1, REFERENCE_CLIP_FRAMES, 1, 1))[:, :, 1:]
                motion = models.vae.encode(ref.repeat(1, 1, s2v.motion_frames, 1, 1))
                h, w = ref_lat.shape[-2:]
                self.cache: S2VCache | None = models.transformer.new_cache(
                    1, (h, w), la.steps, dev, dtype, kv_fp8=engine.kv_cache == "fp8"
                )
                models.transformer.prefill(self.cache, prompt_features, ref_lat, motion)
                # the decoder continues from the motion frames, as the authors' first clip does;
                # it runs on the engine's side stream only, so its cache, freed and made anew
                # at every block, is only ever reused in that stream's order. A block's width
                # a pass: the same pixels as one wide pass, the compiled block-wide graph
                # reused, and no 73-frame activations (7 GB a buffer at 704x384)
                self.decoder: WanDecodeStream | None = models.vae.stream()
                with engine.side_stream.after_main(motion):
                    self.decoder.decode(motion, latents_per_pass=s2v.frames_per_block)
            self.latent_hw = (h, w)
        self._ahead: tuple[int, Tensor] | None = None  # (k, latents) of a block sampled ahead
        self.read_ahead = 1 if la.overlap else 0

    def audio_end(self, k: int) -> int:
        """Block k's window ends `audio_lookahead_frames` after its last frame."""
        return self.plan.n_end(k) * MODEL_SAMPLES_PER_FRAME + self.lookahead

    def _audio(self, k: int, chunk: Chunk) -> Tensor:
        """(1, S, A, frames): the block's frames' wav2vec2 hidden states."""
        audio, first_sample = self.window_audio(k)
        speech = self.engine.models.speech
        first_frame = first_sample // MODEL_SAMPLES_PER_FRAME
        states = to_feature_rate(speech.hidden_states(audio))
        feats_FSA = to_video_frames(states, FPS, self.window // MODEL_SAMPLES_PER_FRAME)
        lo = chunk.start - first_frame
        block = feats_FSA[lo : lo + chunk.length]
        return block.permute(1, 2, 0)[None].to(self.engine.device, self.engine.dtype)

    def make_chunk(self, k: int, chunk: Chunk) -> Iterator[np.ndarray]:
        """Block k's 12 frames, decoded on the engine's side stream. Where block k+1's
        audio is already here (a backlog: the engine is behind real time, or a bench), block
        k+1's audio features and DiT are queued on the main stream before the host waits for
        block k's frames, so the two run together and a block costs its DiT; block k+1's
        latents wait for the next call (`_ahead`). Same frames, same order."""
        if self.cache is None or self.decoder is None:
            raise RuntimeError("the stream is closed")
        decoder, side = self.decoder, self.engine.side_stream
        with torch.inference_mode():
            x = self._latents(k, chunk)
            with self.times.stage("decode"), side.after_main(x):
                video = decoder.decode(x)  # (1, 3, 12, H, W) in [-1, 1]
            if self.read_ahead and self.has_audio_for(k + 1):
                self._ahead = (k + 1, self._sample(k + 1, self.plan.n_chunk(k + 1)))
            with self.times.stage("decode"):
                frames = side.host(lambda: to_uint8_frames(video[0]))
        yield frames

    def started_ahead(self, k: int) -> bool:
        return self._ahead is not None and self._ahead[0] == k

    def _latents(self, k: int, chunk: Chunk) -> Tensor:
        """Block k's latents: sampled during block k-1's call where its audio was here."""
        if self._ahead is None:
            return self._sample(k, chunk)
        ahead_k, x = self._ahead
        self._ahead = None
        if ahead_k != k:  # the stream makes blocks in order: nothing else can come next
            raise RuntimeError(f"block {ahead_k} was sampled ahead, but block {k} came next")
        return x

    def _sample(self, k: int, chunk: Chunk) -> Tensor:
        """Block k's latents (1, C, 3, h, w): its audio features, 4 Euler steps of the DiT,
        the cache advanced past it."""
        assert self.cache is not None
        engine = self.engine
        dev, dtype = engine.device, engine.dtype
        transformer, la = engine.models.transformer, self.cfg.liveavatar
        with self.times.stage("audio"):
            feats = self._audio(k, chunk)
        with self.times.stage("dit"):
            audio = transformer.encode_audio(feats)
            h, w = self.latent_hw
            shape = (1, transformer.cfg.out_dim, transformer.cfg.frames_per_block, h, w)
            x = torch.randn(shape, dtype=dtype, device=dev, generator=self.generator)
            sigmas, timesteps = engine.sigmas, engine.timesteps
            for i in range(la.steps):
                flow = transformer.forward_block(
                    x, timesteps[i : i + 1], audio, self.cache, i, None, la.ref_distance
                )
                # diffusers' Euler step, as the authors' scheduler takes it: in fp32, the
                # result back in the model's dtype
                x = (x.float() + (sigmas[i + 1] - sigmas[i]) * flow.float()).to(dtype)
            self.cache.advance()
        return x

    def release(self) -> None:
        self.cache = None
        self.decoder = None
        self._ahead = None
