"""The fake family's engine: the start-up contract (`pipeline.family_engine.EngineBase`)
and a windowed stream (`pipeline.windowed_stream.WindowedStream`), with no model."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.family_engine import EngineBase
from pipeline.schedule import Chunk, ChunkPlan, StreamStep
from pipeline.stream import FrameBatch, Reference, no_prompt
from pipeline.windowed_stream import WindowedStream
from support.fakewan import FakeWanConfig

WINDOW_FRAMES = 8  # audio frames a chunk reads


class FakeWanEngine(EngineBase):
    warmup_steps = 3

    @classmethod
    def load(cls, cfg: FacecastConfig, device: str = "cpu") -> FakeWanEngine:
        return cls(cfg, torch.device(device))

    def stream_step(self, k: int) -> StreamStep:
        return ChunkPlan(self.cfg.schedule).step(k, 1, 0)

    def new_stream(
        self,
        reference_rgb: Reference,
        seed: int = 0,
        sinks: list[Callable[[FrameBatch], None]] | None = None,
        prompt: str | None = None,
    ) -> FakeWanStream:
        no_prompt(self.cfg, prompt)
        assert isinstance(reference_rgb, np.ndarray)
        return FakeWanStream(self.cfg, reference_rgb, sinks or [])


class FakeWanStream(WindowedStream):
    def __init__(
        self, cfg: FacecastConfig, reference: np.ndarray, sinks: list[Callable[[FrameBatch], None]]
    ) -> None:
        super().__init__(cfg, WINDOW_FRAMES * MODEL_SAMPLES_PER_FRAME, sinks)
        self.gain = cfg.section(FakeWanConfig).gain
        v = cfg.video
        with self.times.stage("init"):  # the reference at the video's size, nearest pixels
            rows = np.arange(v.height) * reference.shape[0] // v.height
            cols = np.arange(v.width) * reference.shape[1] // v.width
            self.reference = reference[rows][:, cols].astype(np.float32)

    def audio_end(self, k: int) -> int:
        return self.plan.n_end(k) * MODEL_SAMPLES_PER_FRAME

    def make_chunk(self, k: int, chunk: Chunk) -> Iterator[np.ndarray]:
        with self.times.stage("dit"):
            audio, _ = self.window_audio(k)
            rms = float(np.sqrt(np.mean(audio**2))) if len(audio) else 0.0
            loud = min(1.0, self.gain * rms)
            frame = (1 - loud) * self.reference + loud * 255
        yield np.repeat(frame.astype(np.uint8)[None], chunk.length, axis=0)

    def release(self) -> None:
        pass
