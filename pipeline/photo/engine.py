"""The photo stack behind the engine's streaming session API.

`PhotoEngine` and `PhotoStream` satisfy the engine seam (`pipeline.stream.StreamingEngine`
and `AvatarStream`: `stream_step`, `warmup`, `step_seconds`, `new_stream`; `push_audio`,
`samples_needed`, `generate_ready`, `finish`, `close`), so `facecast render`, `serve`, the
engine process, playout planning and the benchmarks drive it unchanged. `Engine.load`
returns one for a config with `runtime.stack: photo`.

The chunk plan is the engine's (`ChunkPlan`), counted in video frames, with no seams and no
boundary frames: the motion is continuous by construction, since each chunk's mouth comes
from its own audio window (context and lookahead included) and the idle motion is made in
frame order. Any split of the audio into pushes therefore gives the same frames.

Rolling memory: between chunks a session keeps the prepared photo and its decoder, the
audio the next chunk reads, the idle motion's few floats and next blinks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.family_engine import EngineBase
from pipeline.module import Module, build_seeded, resolve_weights_dir
from pipeline.photo.face import FaceGeometry, PreparedPhoto, prepare_photo
from pipeline.photo.idle import IdleMotion
from pipeline.photo.motion import MotionNet, window_frames
from pipeline.photo.warp import WarpDecoder
from pipeline.schedule import Chunk, ChunkPlan, StreamStep
from pipeline.stream import FrameBatch, StageTimes, no_prompt
from pipeline.timeline import AudioTimeline


class PhotoEngine(EngineBase):
    """The audio→motion model, loaded once; sessions each hold their own photo. Nothing
    to offload, compile or cast to FP8: the model is 1 MB."""

    def __init__(self, cfg: FacecastConfig, modules: dict[str, Module]) -> None:
        super().__init__(cfg, modules["motion"].device)
        self.modules = modules

    @classmethod
    def load(cls, cfg: FacecastConfig, device: str = "cpu") -> PhotoEngine:
        dev = torch.device(device)
        net = build_seeded(lambda: MotionNet(cfg.photo), cfg.runtime.init_seed, dev)
        weights = resolve_weights_dir(cfg.runtime.weights) if cfg.runtime.weights else None
        module = Module("motion", net, torch.float32, dev).load(weights).place()
        return cls(cfg, {"motion": module})

    def stream_step(self, k: int) -> StreamStep:
        return ChunkPlan(self.cfg.schedule).step(k, 1, self.cfg.photo.lookahead_frames)

    def new_stream(
        self,
        reference_rgb: np.ndarray | PreparedPhoto,
        seed: int = 0,
        sinks: list[Callable[[FrameBatch], None]] | None = None,
        prompt: str | None = None,
    ) -> PhotoStream:
        no_prompt(self.cfg, prompt)
        return PhotoStream(self, reference_rgb, seed, sinks or [])

    def warmup_reference(self) -> PreparedPhoto:
        return warmup_photo(self.cfg)


def warmup_photo(cfg: FacecastConfig) -> PreparedPhoto:
    """A grey frame with a face box where portraits have one: the shapes and the work of
    a real session, without needing a face to detect."""
    W, H = cfg.video.width, cfg.video.height
    side = 0.45 * min(W, H)
    x, y = 0.5 * (W - side), 0.3 * (H - side)
    face = FaceGeometry(
        box=(x, y, side, side),
        mouth=(x + 0.5 * side, y + 0.8 * side),
        mouth_half_width=0.19 * side,
        eyes=((x + 0.2 * side, y + 0.36 * side, 0.2 * side, 0.09 * side),)
        + ((x + 0.6 * side, y + 0.36 * side, 0.2 * side, 0.09 * side),),
        skin=(180.0, 140.0, 120.0),
        lips=(150.0, 80.0, 80.0),
    )
    return PreparedPhoto(np.full((H, W, 3), 127, np.uint8), face)


class PhotoStream:
    """One open-ended stream of one photo: push audio, collect frames in order, once each."""

    def __init__(
        self,
        engine: PhotoEngine,
        reference: np.ndarray | PreparedPhoto,
        seed: int,
        sinks: list[Callable[[FrameBatch], None]],
    ) -> None:
        cfg = engine.cfg
        self.cfg = cfg
        self.seed = seed
        self.sinks = sinks
        self.net = engine.modules["motion"]
        self.plan = ChunkPlan(cfg.schedule)
        self.times = StageTimes()
        self.timeline = AudioTimeline()
        with self.times.stage("init"):
            v = cfg.video
            if not isinstance(reference, PreparedPhoto):
                reference = prepare_photo(reference, v.width, v.height, cfg.photo)
            self.photo: PreparedPhoto | None = reference
            self.decoder = WarpDecoder(
                reference.framed, reference.face, cfg.photo.jaw_open, engine.device
            )
            self.idle = IdleMotion(seed, cfg.photo.head_motion, cfg.photo.blink)
        self.next_n = 0
        self.frames_emitted = 0
        self.total_frames: int | None = None
        self.chunk_log: deque[Chunk] = deque(maxlen=64)
        self.closed = False

    # -- streaming API (pipeline.stream.AvatarStream) --------------------------------------
    def push_audio(self, samples: np.ndarray) -> None:
        if self.total_frames is not None:
            raise RuntimeError("push_audio after finish(): the stream has ended")
        self.timeline.append(samples)

    def samples_needed(self) -> int:
        if self.total_frames is not None:
            return 0
        return max(0, self._window(self.next_n)[1] - self.timeline.total)

    def generate_ready(self) -> list[FrameBatch]:
        out: list[FrameBatch] = []
        while self.total_frames is None and self.timeline.total >= self._window(self.next_n)[1]:
            out += self._advance()
        return out

    def finish(self) -> list[FrameBatch]:
        if self.total_frames is not None:
            return []
        self.total_frames = round(self.timeline.total / MODEL_SAMPLES_PER_FRAME)
        out: list[FrameBatch] = []
        while self.frames_emitted < self.total_frames:
            out += self._advance()
        return out

    def close(self) -> None:
        self.photo = None
        self.closed = True

    # -- internals ---------------------------------------------------------------------
    def _window(self, k: int) -> tuple[int, int]:
        chunk = self.plan.n_chunk(k)
        return window_frames(self.cfg.photo, chunk.start, chunk.length)

    def _advance(self) -> list[FrameBatch]:
        chunk = self.plan.n_chunk(self.next_n)
        self.chunk_log.append(chunk)
        lo, hi = self._window(self.next_n)
        with self.times.stage("motion"):
            with torch.inference_mode():
                audio = torch.from_numpy(self.timeline.read(lo, hi))[None].to(self.net.device)
                mouth = self.net.model.run_window(audio, chunk.length)[0].cpu().numpy()
        with self.times.stage("warp"):
            idle = self.idle.frames(chunk.start, mouth[:, 0])
            frames = self.decoder.render(np.concatenate([mouth, idle], axis=1))
        self.next_n += 1
        self.timeline.drop_before(self._window(self.next_n)[0])
        if self.total_frames is not None:
            frames = frames[: max(0, self.total_frames - chunk.start)]
        batch = FrameBatch(chunk.start, frames)
        self.frames_emitted = chunk.start + len(frames)
        for sink in self.sinks:
            sink(batch)
        return [batch]
