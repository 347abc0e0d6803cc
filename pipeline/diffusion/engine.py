"""The diffusion stack's engine (models, loaded once) and its streams (one per session).

A session is the streaming mode: audio is pushed as it arrives, `generate_ready()` runs
every chunk the audio so far allows and returns the new frames, `finish()` closes the
stream. Batch mode (`render_file` in `pipeline.render`) is the same loop fed from a file.

Rolling memory: between chunks a session keeps only the reference conditioning, the last
few latent frames of the latest N chunk (boundary and anchors), the last `window` low-res
frames for SR, the VAE decoder's causal cache, and the audio that later chunks still read.
Nothing grows with the stream's duration.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.diffusion.build import build_models, module_dtype
from pipeline.diffusion.stages.a2v import A2VStage
from pipeline.diffusion.stages.context import ContextStage
from pipeline.diffusion.stages.decode import DecodeStage
from pipeline.diffusion.stages.init import InitStage, ReferenceCond
from pipeline.diffusion.stages.sr import SRStage
from pipeline.diffusion.vae import Cache
from pipeline.errors import ConfigError
from pipeline.family_engine import EngineBase
from pipeline.module import Module, resolve_weights_dir
from pipeline.offload import OffloadManager
from pipeline.placement import Placement, build_blockwise
from pipeline.schedule import Chunk, ChunkPlan, StreamStep
from pipeline.stream import FrameBatch, StageTimes, no_prompt
from pipeline.timeline import AudioTimeline

if TYPE_CHECKING:
    from pipeline.stream import Reference

log = logging.getLogger("facecast.engine")


class Engine(EngineBase):
    """Models and stages shared by all sessions of one config on one device."""

    def __init__(self, cfg: FacecastConfig, modules: dict[str, Module]) -> None:
        super().__init__(cfg, modules["vae"].device)
        self.modules = modules
        self.offloader: OffloadManager | None = None  # set when DiT blocks are offloaded
        # called with a model's name at the stage boundary before it runs (offload prefetch)
        self.stage_hooks: list[Callable[[str], None]] = []

    @classmethod
    def load(
        cls, cfg: FacecastConfig, device: str = "cpu", placement: Placement | None = None
    ) -> Engine:
        """Build (or load) the models on `device`, placed as `placement` plans: by default
        every weight resident; `pipeline.placement.plan_placement` plans for a GPU. For any
        config, photo stack included, use `pipeline.startup.load_engine`."""
        if not issubclass(cls, cfg.family.engine_class()):
            raise ConfigError(
                f"config {cfg.name!r} is the {cfg.runtime.stack} stack: load it with "
                "pipeline.startup.load_engine"
            )
        dev = torch.device(device)
        placement = placement or Placement()
        manager = None
        if placement.blockwise:
            modules, manager = build_blockwise(cfg, dev, placement)
        else:
            weights = resolve_weights_dir(cfg.runtime.weights) if cfg.runtime.weights else None
            modules = {
                name: Module(name, model, module_dtype(cfg, name), dev).load(weights).place()
                for name, model in build_models(cfg, dev).items()
            }
        engine = cls(cfg, modules)
        apply_placement(engine, placement, manager)
        return engine

    def compile(self, mode: str | None = None) -> int:
        """torch.compile every DiT block (`pipeline.compile.compile_engine`)."""
        from pipeline.compile import compile_engine

        return compile_engine(self, mode)

    def fp8_targets(self, scaling: str) -> list[tuple[nn.Module, str]]:
        """(parent, attribute) of every linear layer FP8 replaces (`pipeline.precision`)."""
        out: list[tuple[nn.Module, str]] = []
        for name in ("a2v", "sr"):
            for block in self.modules[name].model.transformer.blocks:
                out.append((block.attn, "qkv"))
                if scaling == "row":
                    out.append((block.attn, "out"))
                out += [(block.mlp, "0"), (block.mlp, "2")]
                if block.cond is not None:
                    out.append((block, "cond"))
        return out

    def stream_step(self, k: int) -> StreamStep:
        """What step k of a stream waits for and emits (video frames), from the schedule."""
        cfg = self.cfg
        plan = ChunkPlan(cfg.schedule)
        return plan.step(k, cfg.frames_per_latent, cfg.lookahead_frames)

    def new_stream(
        self,
        reference_rgb: Reference,
        seed: int = 0,
        sinks: list[Callable[[FrameBatch], None]] | None = None,
        prompt: str | None = None,
    ) -> Stream:
        no_prompt(self.cfg, prompt)
        if not isinstance(reference_rgb, np.ndarray):  # a prepared photo: its framed image
            reference_rgb = reference_rgb.framed
        return Stream(self, reference_rgb, seed, sinks or [])


class Stream:
    """One open-ended stream: push audio, collect frames in order, each exactly once."""

    def __init__(
        self,
        engine: Engine,
        reference_rgb: np.ndarray,
        seed: int,
        sinks: list[Callable[[FrameBatch], None]],
    ) -> None:
        cfg = engine.cfg
        self.cfg = cfg
        self.seed = seed
        self.sinks = sinks
        self.plan = ChunkPlan(cfg.schedule)
        self.r = cfg.diffusion.vae.temporal_ratio
        m = engine.modules
        self.context = ContextStage(m["audio"], cfg, seed, dtype=m["a2v"].dtype)
        self.a2v = A2VStage(m["a2v"], cfg.diffusion.sampler)
        self.sr = SRStage(m["sr"], seed)
        self.stage_hooks = engine.stage_hooks
        self.decode = DecodeStage(m["vae"], cfg.video.width, cfg.video.height)
        self.times = StageTimes()
        self.timeline = AudioTimeline()

        with self.times.stage("init"):
            self.ref: ReferenceCond | None = InitStage(m["vae"], cfg).run(reference_rgb)

        self.next_n = 0  # index of the next N chunk to generate
        self.latents: dict[int, Tensor] = {}  # absolute latent pos → (1, C, 1, h, w), rolling
        self.sr_context: Tensor | None = None  # last `window` emitted low-res frames
        self.vae_cache: Cache | None = None
        self.segments = 0
        self.frames_emitted = 0
        self.total_frames: int | None = None  # known once the stream ends
        # the latest chunks in execution order, for tests and metrics (bounded)
        self.chunk_log: deque[Chunk] = deque(maxlen=64)
        self.closed = False

    # -- streaming API -----------------------------------------------------------------
    def push_audio(self, samples: np.ndarray) -> None:
        if self.total_frames is not None:
            raise RuntimeError("push_audio after finish(): the stream has ended")
        self.timeline.append(samples)

    def samples_needed(self) -> int:
        """16 kHz samples still missing before `generate_ready()` can run the next step."""
        if self.total_frames is not None:
            return 0
        _, needed_sample = self.context.audio_window(self.plan.n_chunk(self.next_n))
        return max(0, needed_sample - self.timeline.total)

    def generate_ready(self) -> list[FrameBatch]:
        """Run every N chunk (and its I chunk) whose audio, lookahead included, has arrived."""
        out: list[FrameBatch] = []
        while self._audio_ready(self.next_n):
            out += self._advance()
        return out

    def finish(self) -> list[FrameBatch]:
        """End of stream: generate up to round(seconds * FPS) frames and emit the rest."""
        if self.total_frames is not None:
            return []
        self.total_frames = round(self.timeline.total / MODEL_SAMPLES_PER_FRAME)
        needed = -(-self.total_frames // self.r)
        out: list[FrameBatch] = []
        while self.next_n == 0 or self.plan.n_end(self.next_n - 1) < needed:
            if self.total_frames == 0:
                break
            out += self._advance()
        if self.next_n > 0:
            out += self._emit(*self.plan.tail(self.next_n - 1))
        self._release()
        return out

    def close(self) -> None:
        self._release()
        self.ref = None
        self.closed = True

    # -- internals ---------------------------------------------------------------------
    def _audio_ready(self, k: int) -> bool:
        chunk = self.plan.n_chunk(k)
        _, needed_sample = self.context.audio_window(chunk)
        return self.total_frames is None and self.timeline.total >= needed_sample

    def _advance(self) -> list[FrameBatch]:
        """Generate N_k, then I_{k-1}; emit what became final: I_{k-1} and N_k's body."""
        k = self.next_n
        n = self.plan.n_chunk(k)
        n_lat = self._generate(n)
        for i in range(n.length):
            self.latents[n.start + i] = n_lat[:, :, i : i + 1]
        out: list[FrameBatch] = []
        i_lat = None
        if k > 0 and self.plan.w > 0:
            ic = self.plan.i_chunk(k - 1)
            i_lat = self._generate(ic)
        self._hand_over("sr")  # the A2V work is queued: start copying SR's first blocks
        if i_lat is not None:
            out += self._emit_latents(i_lat[:, :, 1:-1], ic.emit[0])
        out += self._emit(*n.emit, next_model="a2v")
        self.next_n += 1
        self._trim_memory()
        return out

    def _generate(self, chunk: Chunk) -> Tensor:
        self.chunk_log.append(chunk)
        with self.times.stage("context"):
            ctx = self.context.run(self.timeline, chunk, self.latents)
        with self.times.stage("a2v"):
            lat = self.a2v.run(ctx, self._reference())
        return lat

    def _reference(self) -> ReferenceCond:
        if self.ref is None:
            raise RuntimeError("the session is closed")
        return self.ref

    def _emit(self, begin: int, end: int, next_model: str | None = None) -> list[FrameBatch]:
        if end <= begin:
            return []
        lat = torch.cat([self.latents[p] for p in range(begin, end)], dim=2)
        return self._emit_latents(lat, begin, next_model)

    def _hand_over(self, model: str) -> None:
        """`model` runs next: its stage hooks start now, behind the work already queued (with
        offload, the copies of its first blocks, so that its first block does not wait)."""
        for hook in self.stage_hooks:
            hook(model)

    def _emit_latents(
        self, low: Tensor, begin: int, next_model: str | None = None
    ) -> list[FrameBatch]:
        """SR + decode one segment of final low-res latents and hand its frames to sinks."""
        first_frame = begin * self.r
        if self.total_frames is not None and first_frame >= self.total_frames:
            return []
        assert first_frame == self.frames_emitted, "frames must leave in order, each once"
        with self.times.stage("sr"):
            ctx_n = 0 if self.sr_context is None else self.sr_context.shape[2]
            seq = low if self.sr_context is None else torch.cat([self.sr_context, low], dim=2)
            full = self.sr.run(seq, ctx_n, self._reference(), self.segments)
            w = self.cfg.diffusion.sr.window
            self.sr_context = seq[:, :, seq.shape[2] - min(w, seq.shape[2]) :] if w else None
        if next_model:
            self._hand_over(next_model)  # before decode, whose frame copy syncs the host
        with self.times.stage("decode"):
            frames, self.vae_cache = self.decode.run(full, self.vae_cache)
        self.segments += 1
        if self.total_frames is not None:
            frames = frames[: max(0, self.total_frames - first_frame)]
        batch = FrameBatch(first_frame, frames)
        self.frames_emitted = first_frame + len(frames)
        for sink in self.sinks:
            sink(batch)
        return [batch]

    def _trim_memory(self) -> None:
        """Keep only latents that the next N chunk's boundary and the next I chunk read."""
        last = self.next_n - 1
        keep_from = min(
            self.plan.n_end(last) - self.plan.b, self.plan.n_end(last) - self.plan.w - 1
        )
        for pos in [p for p in self.latents if p < keep_from]:
            del self.latents[pos]
        nxt = self.plan.n_chunk(self.next_n)
        lo, _ = self.context.audio_window(self.plan.i_chunk(last) if self.plan.w else nxt)
        self.timeline.drop_before(min(lo, self.context.audio_window(nxt)[0]))

    def _release(self) -> None:
        self.latents.clear()
        self.sr_context = None
        self.vae_cache = None


def apply_placement(
    engine: Engine, placement: Placement, manager: OffloadManager | None = None
) -> None:
    """Offload a loaded engine's DiT block stacks as planned (`manager`: blocks already
    packed by `build_blockwise`) and start each stack's first copies at the stage boundary
    before it runs."""
    if manager is None and placement.offload:
        manager = OffloadManager(engine.device, placement.offload)
        for name in ("a2v", "sr"):
            blocks = engine.modules[name].model.get_submodule("transformer.blocks")
            assert isinstance(blocks, nn.ModuleList)
            manager.attach(name, blocks)
        if manager.is_cuda:
            torch.cuda.empty_cache()  # the blocks' former GPU copies
    if manager is not None:
        engine.offloader = manager
        engine.stage_hooks.append(manager.prefetch_stack)
