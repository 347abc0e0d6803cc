"""The seam between the engine and what drives it (the realtime worker, render, tests).

`AvatarStream` is what one open-ended stream offers: push audio, ask how much the next step
needs, generate what is ready, finish, close; it hands out `FrameBatch`es and keeps its
`StageTimes`. `StreamingEngine` is what a server needs of an engine: its config, its
measured step times, the schedule's steps, and new streams. Every model family's engine
(the project's diffusion `pipeline.diffusion.engine.Engine`, the photo stack's
`pipeline.photo.engine.PhotoEngine`, `pipeline.flashhead.engine.FlashHeadEngine`) and the
child-process `realtime.engine_process` proxy satisfy them; the type checker holds them to it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Union

import numpy as np
import torch

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig
    from pipeline.photo.face import PreparedPhoto
    from pipeline.schedule import StreamStep


@dataclass
class FrameBatch:
    start: int  # index of the first frame; frame n covers audio [n*40 ms, (n+1)*40 ms)
    frames: np.ndarray  # uint8 (N, H, W, 3) RGB


@dataclass
class StageTimes:
    """Wall seconds per stage, accumulated; used by progress output and benchmarks."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, dt: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + dt

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """`with times.stage("dit"):` adds the block's wall seconds to `name` (a block that
        raises adds nothing: its time is no stage's)."""
        with stage_of([self], name):
            yield


@contextmanager
def stage_of(times: list[StageTimes], name: str) -> Iterator[None]:
    """A batch's stage: its wall seconds go to every stream's times (each waited for it)."""
    t = time.perf_counter()
    yield
    seconds = time.perf_counter() - t
    for each in times:
        each.add(name, seconds)


# Who the avatar is: an identity image (uint8 H x W x 3), or a photo the photo stack has
# already checked and framed (`pipeline.photo.face.prepare_photo`, done once per server).
Reference = Union[np.ndarray, "PreparedPhoto"]


class AvatarStream(Protocol):
    def push_audio(self, samples: np.ndarray) -> None:
        """Append float32 mono model-rate audio (pipeline.clock.MODEL_RATE)."""
        ...

    def samples_needed(self) -> int:
        """Model-rate samples still missing before the next step can run."""
        ...

    def generate_ready(self) -> list[FrameBatch]:
        """Run every step whose audio has arrived; frames in order, each once. A stream
        that makes a step's frames in pieces also offers `iter_ready()`, the same batches
        each as soon as it exists (`ready_pieces`)."""
        ...

    def finish(self) -> list[FrameBatch]:
        """End of audio: the rest of the frames."""
        ...

    def close(self) -> None: ...


@dataclass
class StartupReport:
    """How an engine was started (`pipeline.startup.start_engine`): its load, its
    preparation (kernel picks, compiled blocks, FP8, warm-up) and the whole, in seconds."""

    load_seconds: float = 0.0
    prepare: dict = field(default_factory=dict)  # sdpa picks, compiled blocks, warm-up
    seconds: float = 0.0  # the whole start-up

    def to_dict(self) -> dict:
        return {"load_seconds": self.load_seconds, **self.prepare, "startup_seconds": self.seconds}


class StreamingEngine(Protocol):
    # read-only here, so that an engine may hold narrower types (a proxy always has them)
    @property
    def cfg(self) -> FacecastConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def step_seconds(self) -> dict[str, float] | None:
        """Measured by the warm-up: {"first": step 0, "steady": a later step}."""
        ...

    @property
    def startup(self) -> StartupReport | None: ...

    def stream_step(self, k: int) -> StreamStep: ...

    def new_stream(
        self, reference_rgb: Reference, seed: int = 0, prompt: str | None = None
    ) -> AvatarStream:
        """A stream of `reference_rgb`. `prompt`: what the video shows, in words, for a model
        that reads one (`pipeline.families.Family.prompts`); the others refuse one."""
        ...


def ready_pieces(stream: AvatarStream) -> Iterator[FrameBatch]:
    """What `generate_ready()` returns, batch by batch as each exists where the stream can
    (`iter_ready`: FlashHead Pro sends a chunk's first new frames before the rest are
    decoded), else all at the end of the step."""
    pieces = getattr(stream, "iter_ready", None)
    return pieces() if pieces is not None else iter(stream.generate_ready())


def samples_wanted(stream: AvatarStream) -> int:
    """The audio a stream can use now: its next step's, or, where a stream starts its next
    step while it finishes this one (`WindowedStream.read_ahead`), the step after's too. A
    feed with a backlog hands it all over; one without simply hands what has come."""
    wanted = getattr(stream, "samples_wanted", None)
    return wanted() if wanted is not None else stream.samples_needed()


def steps_to_frames(stream: AvatarStream) -> int:
    """How many steps from now the audio a stream is handed now comes out as frames: 1, or 2
    for a stream finishing a step started ahead (`WindowedStream.started_ahead`), which
    starts the handed audio's step beside it and finishes that one a step later."""
    steps = getattr(stream, "steps_to_frames", None)
    return steps() if steps is not None else 1


def no_prompt(cfg: FacecastConfig, prompt: str | None) -> None:
    """The one refusal of a prompt by an engine whose model reads none."""
    if prompt is not None:
        from pipeline.errors import ConfigError

        raise ConfigError(f"config {cfg.name!r} reads no prompt; only --model liveavatar does")
