"""Where a server's engine runs: in the server's process or in one of its own.

Both hosts are a `HostedEngine`: the `StreamingEngine` sessions use, plus the little the
server asks of the host itself (whether a step crosses a process, the GPU's peak memory,
closing it). `InProcessEngine` wraps an engine started here; `EngineProcess`
(`realtime.engine_process`) is the proxy of one started in a child. Nothing outside this
module and that one needs to know which it has.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Protocol

import torch

from pipeline.config import FacecastConfig
from pipeline.families import family_named
from pipeline.schedule import StreamStep
from pipeline.startup import EngineOptions, start_engine
from pipeline.stream import AvatarStream, Reference, StartupReport, StreamingEngine
from pipeline.warmup import Progress
from realtime.engine_process import EngineProcess, batch_counts, gpu_memory


class HostedEngine(StreamingEngine, Protocol):
    """A started engine as the server holds it."""

    @property
    def own_process(self) -> bool:
        """Whether steps run in another process (serving is slower there on a CPU)."""
        ...

    @property
    def batches_steps(self) -> bool:
        """Whether the engine runs its sessions' steps itself, several as one batch
        (`pipeline.batching`); if not, the server's sessions take turns."""
        ...

    @property
    def capacity(self) -> int | None:
        """Sessions the engine measured at start-up that it carries at real time; None
        where it measures none."""
        ...

    def gpu_memory(self) -> tuple[int, int] | None:
        """Bytes the engine's tensors hold on its GPU now, and their peak; None on a CPU.
        May wait for a step to finish."""
        ...

    def batching(self) -> tuple[int, int] | None:
        """(batches run, steps in them) since start-up, for an engine that batches its
        sessions' steps (their ratio is the batch size in use); None for one that does not.
        May wait for the engine's process."""
        ...

    def close(self) -> None:
        """Free the engine (blocking: call it off the event loop)."""
        ...


class InProcessEngine:
    """An engine in the server's own process, as a `HostedEngine`."""

    own_process = False

    def __init__(self, engine: StreamingEngine) -> None:
        self.engine = engine

    @property
    def cfg(self) -> FacecastConfig:
        return self.engine.cfg

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def step_seconds(self) -> dict[str, float] | None:
        return self.engine.step_seconds

    @property
    def startup(self) -> StartupReport | None:
        return self.engine.startup

    @property
    def batches_steps(self) -> bool:
        return getattr(self.engine, "batcher", None) is not None

    @property
    def capacity(self) -> int | None:
        return getattr(self.engine, "capacity", None)

    def stream_step(self, k: int) -> StreamStep:
        return self.engine.stream_step(k)

    def new_stream(
        self, reference_rgb: Reference, seed: int = 0, prompt: str | None = None
    ) -> AvatarStream:
        if prompt is None:  # the keyword only when given: engines of integrations may lack it
            return self.engine.new_stream(reference_rgb, seed=seed)
        return self.engine.new_stream(reference_rgb, seed=seed, prompt=prompt)

    def gpu_memory(self) -> tuple[int, int] | None:
        return gpu_memory(self.engine.device)

    def batching(self) -> tuple[int, int] | None:
        return batch_counts(self.engine)

    def close(self) -> None:
        """Nothing to free early: the engine's memory goes with the server's process."""


def cpu_engine_threads() -> int:
    """torch's threads for an engine on a CPU beside the media loop: every core but one. An
    engine whose threads outnumber the free cores stalls at every barrier (the demo on 2
    cores beside a busy loop: 0.25 s a step alone, 0.76 s with 2 threads, 0.41 s either way
    with 1; the tiny config with Chromium beside it: 1.8 s against 0.18 s)."""
    return max(1, (os.cpu_count() or 2) - 1)


def engine_in_own_process(options: EngineOptions) -> bool:
    """Where the engine runs unless told: in a process of its own on a CPU (one core left
    to the media loop), in the server's process on a GPU (bench/RESULTS.md has both)."""
    return options.device == "cpu"


def torch_threads_in_process(options: EngineOptions, stack: str) -> int | None:
    """torch's CPU thread count for a server whose engine runs in the server's process (None:
    leave it). On a GPU the photo stack computes nothing on the CPU with torch, and torch's
    threads serve the VAD's 512-sample windows: 16 of them beside the media loop kept the
    VAD thread 79 % busy, and `photo720` reached the viewer at 15-17 fps of 25; with one,
    100 % fresh at 25 fps (bench/RESULTS.md, "The photo stack at 720p"). The diffusion
    engine keeps its threads: with one, rt720-low-latency's served steps took 0.55-0.78 s
    against 0.44 s, and its first live call waited 33 s for a frame."""
    if options.threads is not None or options.device == "cpu":
        return None
    return family_named(stack).gpu_torch_threads


def host_engine(
    options: EngineOptions, own_process: bool | None = None, progress: Progress | None = None
) -> HostedEngine:
    """Start the engine and wait until it is warm (blocking: run it off the event loop), in
    a process of its own unless told not to, and set this process's torch threads for it.
    `progress` hears each part of the start-up as it begins, from either process."""
    if own_process is None:
        own_process = engine_in_own_process(options)
    if own_process:
        if options.device == "cpu" and options.threads is None:
            options = dataclasses.replace(options, threads=cpu_engine_threads())
        hosted = EngineProcess(options, progress)
        torch.set_num_threads(1)  # this process only runs the VAD now
        return hosted
    engine, _ = start_engine(options, progress)
    threads = torch_threads_in_process(options, engine.cfg.family.stack)
    if threads is not None:
        torch.set_num_threads(threads)
    return InProcessEngine(engine)
