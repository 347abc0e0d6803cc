"""The start-up contract of a model family's engine, and the little every engine shares.

Start-up (`pipeline.startup`), the quality gate (`facecast gate`) and the benchmarks treat
every family's engine alike through `FamilyEngine`: what warm-up runs (its steps and a
reference its streams take without any detection), what FP8 replaces, what compile wraps,
and the status the server reports (`offloader`, `compiled`, `precision`, `warmup_seconds`,
`step_seconds`, `capacity`, `startup`). `EngineBase` holds that status and the shared
methods; an engine overrides what its family does differently. `engine_of` loads the
engine a config's family names (`pipeline.families`).
"""

# mypy: disallow-untyped-defs

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

from pipeline.errors import ConfigError
from pipeline.stream import StreamingEngine

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig
    from pipeline.placement import Placement
    from pipeline.stream import Reference, StartupReport
    from pipeline.warmup import Progress


class FamilyEngine(StreamingEngine, Protocol):
    """What start-up, the gate and bench may ask of any family's engine."""

    warmup_steps: int  # steps of a warm-up session that show every chunk shape
    offloader: Any  # the offload manager where DiT blocks stream in, else None
    compiled: bool
    precision: str  # "default", or the FP8 scaling applied (`pipeline.precision`)
    warmup_seconds: float | None
    capacity: int | None  # sessions at real time, where the warm-up measured it
    startup: StartupReport | None  # set by `pipeline.startup.start_engine`
    # the kernels it chose where a family chooses at start-up ({"self_attention": "fp8"}),
    # named in the start-up's report (the bench's JSON says what ran, not what was asked)
    kernels: dict[str, str]

    def warmup_reference(self) -> Reference:
        """An identity its streams accept without any detection."""
        ...

    def warmup(self, seed: int = 0, progress: Progress | None = None) -> float:
        """Every chunk shape once, then a timed session; the seconds it took (`progress`
        told each part as it begins)."""
        ...

    def run_every_shape(self, seed: int = 0) -> None:
        """One throwaway session over every chunk shape (FP8 calibrates on it)."""
        ...

    def fp8_targets(self, scaling: str) -> list[tuple[nn.Module, str]]:
        """(parent, attribute) of the linear layers FP8 replaces."""
        ...

    def precision_applied(self) -> None:
        """The linears now run at `precision`: what the family chooses by it follows."""
        ...

    def compile(self, mode: str | None = None) -> int:
        """torch.compile its hot parts in place; how many blocks were wrapped."""
        ...


class EngineBase:
    """The status every engine keeps and the warm-up every engine runs the same way."""

    warmup_steps = 6  # N_0, N, I, each SR segment, the stream's end (`pipeline.warmup`)

    def __init__(self, cfg: FacecastConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.offloader: Any = None
        self.compiled = False
        self.precision = "default"
        self.warmup_seconds: float | None = None
        # Wall seconds of one warm `generate_ready()` step, measured by `warmup()`:
        # {"first": step 0, "steady": a later step}. Serving plans playout on it.
        self.step_seconds: dict[str, float] | None = None
        self.capacity: int | None = None
        self.startup: StartupReport | None = None  # once started by `start_engine`
        self.kernels: dict[str, str] = {}

    def warmup_reference(self) -> Reference:
        v = self.cfg.video
        return np.full((v.height, v.width, 3), 127, np.uint8)

    def warmup(self, seed: int = 0, progress: Progress | None = None) -> float:
        from pipeline.warmup import warm_up

        return warm_up(self, seed, progress)

    def run_every_shape(self, seed: int = 0) -> None:
        from pipeline.warmup import warm_session

        warm_session(self, seed, timed=False)

    def fp8_targets(self, scaling: str) -> list[tuple[nn.Module, str]]:
        raise ConfigError(f"config {self.cfg.name!r}: --precision does not apply to it")

    def precision_applied(self) -> None:
        pass  # nothing else depends on the linears' precision

    def compile(self, mode: str | None = None) -> int:
        raise ConfigError(f"config {self.cfg.name!r}: --compile does not apply to it")


def engine_of(
    cfg: FacecastConfig, device: str = "cpu", placement: Placement | None = None
) -> FamilyEngine:
    """The engine of a config's family, loaded (not warmed): the placement plan goes to
    a family that offloads; the others place their models themselves."""
    family = cfg.family
    cls = family.engine_class()
    engine: FamilyEngine
    if family.offloads:
        engine = cls.load(cfg, device, placement)
    else:
        engine = cls.load(cfg, device)
    return engine
