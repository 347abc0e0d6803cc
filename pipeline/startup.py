"""Engine start-up, the same for every command: load, pick kernels, compile, warm up.

`facecast serve`, `render`, `bench` and `gate` all start their engine with `start_engine`,
so none of them pays first-use costs (Triton JIT, cuDNN plans, Inductor graphs, every
chunk shape's first run) inside a session: those happen here, are timed, and are reported
(`/healthz` and `/metrics` of the server, the benchmark's JSON).
"""

from __future__ import annotations

import atexit
import gc
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pipeline.config import ATTENTION_BACKENDS, DEFAULT_CONFIG, load_config
from pipeline.errors import ConfigError
from pipeline.families import check_model_flags, family_of, real_model
from pipeline.module import resolve_device
from pipeline.stream import StartupReport
from pipeline.warmup import Progress, no_progress

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig
    from pipeline.families import Family
    from pipeline.family_engine import FamilyEngine
    from pipeline.placement import Placement

# "fp8": FP8 DiT linears with static activation scales calibrated at start-up;
# "fp8-fast": the same, the GEMMs accumulating in Hopper's faster, less exact mode;
# "fp8-rowwise": scales computed per token on every call (pipeline/precision.py)
PRECISIONS = ("default", "fp8", "fp8-fast", "fp8-rowwise")
FP8_SCALING = {"fp8": "static", "fp8-fast": "static", "fp8-rowwise": "row"}
FP8_FAST_ACCUM = frozenset({"fp8-fast"})


@dataclass
class EngineOptions:
    """How to start an engine; the command-line flags of every command map onto these."""

    config: str = DEFAULT_CONFIG  # preset name or YAML path
    device: str = "auto"  # auto, cpu or cuda
    attention: str | None = None  # override runtime.attention (sdpa, flex, facecast)
    compile: bool = False  # torch.compile the DiT blocks
    sdpa_pick: bool = True  # time and pin the fastest SDPA backend per attention shape
    # DiT blocks in pinned host memory, streamed in with prefetch; None: only when the
    # weights would not fit the GPU (or the memory cap)
    offload: bool | None = None
    prefetch: int = 2  # offload: blocks copied ahead of the one computing
    memory_cap_gb: float | None = None  # hard GPU memory cap for this process
    offload_budget_gb: float | None = None  # GPU bytes that offloaded blocks may keep
    warmup: bool = True  # run every chunk shape once before the engine takes work
    record_stalls: bool = False  # offload: keep per-block copy stalls (benchmarks)
    threads: int | None = None  # torch's CPU threads for the engine (None: torch's default)
    precision: str = "default"  # "default": the config's dtype; or one of PRECISIONS
    overrides: dict = field(default_factory=dict)  # dotted config keys → values
    # a real model (`pipeline.families.REAL_MODELS`) instead of `config`, with its weights
    model: str | None = None
    weights: str | None = None  # the release folder users download
    wav2vec: str | None = None  # a wav2vec2 model folder (FlashHead; LiveAvatar: optional)
    lora: str | None = None  # a LoRA file or folder (LiveAvatar)
    prompt: str | None = None  # what the model is told to show (LiveAvatar)
    # a folder where compiled kernels are kept between starts (`pipeline.compile_cache`)
    compile_cache: str | None = None

    def validate(self) -> None:
        if self.attention is not None and self.attention not in ATTENTION_BACKENDS:
            raise ConfigError(
                f"attention {self.attention!r} is not one of {', '.join(ATTENTION_BACKENDS)}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device {self.device!r}: use auto, cpu or cuda")
        if self.prefetch < 1:
            raise ConfigError(f"prefetch must be >= 1 block (got {self.prefetch})")
        if self.memory_cap_gb is not None and self.memory_cap_gb <= 0:
            raise ConfigError(f"memory cap must be > 0 GB (got {self.memory_cap_gb:g})")
        if self.offload_budget_gb is not None and self.offload_budget_gb < 0:
            raise ConfigError(f"offload budget must be >= 0 GB (got {self.offload_budget_gb:g})")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1 (got {self.threads})")
        if self.offload_budget_gb is not None and self.offload is not True:
            raise ConfigError("an offload budget needs --offload")
        self._validate_model()

    def _validate_model(self) -> None:
        """--model's files are there, and no model flag came without --model (the family
        rows say which flags each model needs and takes)."""
        check_model_flags(self.model, self._model_flags())

    def _model_flags(self) -> dict[str, str | None]:
        return {"weights": self.weights, "wav2vec": self.wav2vec, "lora": self.lora} | {
            "prompt": self.prompt
        }

    def config_and_overrides(self) -> tuple[str, dict]:
        """The preset to load and the dotted overrides on it (`--model` picks a real
        model's preset and points it at the user's files)."""
        overrides = dict(self.overrides)
        if self.attention:
            overrides["runtime.attention"] = self.attention
        if self.model is None:
            return self.config, overrides
        (section,) = real_model(self.model).family.sections
        for key, value in self._model_flags().items():
            if value is not None:
                overrides[f"{section}.{key}"] = value
        return self.model, overrides


def load_engine(
    cfg: FacecastConfig, device: str = "cpu", placement: Placement | None = None
) -> FamilyEngine:
    """The engine of a config's model family (`pipeline.families`), loaded, not warmed."""
    from pipeline.family_engine import engine_of

    return engine_of(cfg, device, placement)


def start_engine(
    opts: EngineOptions, progress: Progress | None = None
) -> tuple[FamilyEngine, StartupReport]:
    """Load the engine `opts` describe and make it ready for work; returns (engine, report).
    The same for every family: load; FP8 (before compile: the graphs are traced with it);
    kernel picks, compile and warm-up where the family has them. `progress` is told each
    part as it begins (a server's /healthz says it while it starts: minutes, compiling)."""
    from pipeline.compile import compile_engine, prepare

    say = progress or no_progress

    opts.validate()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    t = time.perf_counter()
    name, overrides = opts.config_and_overrides()
    cfg = load_config(name, overrides=overrides)
    family = family_of(cfg)
    _refuse_flags_the_family_lacks(cfg, family, opts)
    device = torch.device(resolve_device(opts.device))
    placement = _placement(cfg, family, device, opts)
    cache = None
    if opts.compile_cache is not None:
        from pipeline.compile_cache import CompileCache

        say("compile cache: loading")
        cache = CompileCache.open(opts.compile_cache, device)
    say(f"loading {name}")
    engine = load_engine(cfg, str(device), placement)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    report = StartupReport(load_seconds=time.perf_counter() - t)
    log.info("start-up: %s loaded on %s in %.1f s", name, device, report.load_seconds)
    if opts.precision in FP8_SCALING:
        from pipeline.precision import apply_fp8

        say("FP8: calibrating the linears' scales")
        report.prepare["fp8_linears"] = apply_fp8(
            engine, FP8_SCALING[opts.precision], fast_accum=opts.precision in FP8_FAST_ACCUM
        )
        log.info("start-up: %d linears in FP8 (%s)", report.prepare["fp8_linears"], opts.precision)
    if family.picks_sdpa:  # the project's diffusion stack: kernel picks and its compile
        if opts.warmup:
            report.prepare |= prepare(
                engine, compile_blocks=opts.compile, sdpa_pick=opts.sdpa_pick, progress=progress
            )
        elif opts.compile:
            report.prepare["compiled_blocks"] = compile_engine(engine)
    else:
        if opts.compile:
            report.prepare["compiled_blocks"] = engine.compile()
        if opts.warmup:
            report.prepare["warmup_seconds"] = engine.warmup(progress=progress)
    report.prepare |= engine.kernels
    if cache is not None:
        if opts.warmup:  # everything the engine runs is compiled by now
            say("compile cache: saving")
            cache.save()
        report.prepare["compile_cache"] = cache.report()
    report.seconds = time.perf_counter() - t
    log.info("start-up: ready in %.1f s", report.seconds)
    engine.startup = report
    return engine, report


def _refuse_flags_the_family_lacks(
    cfg: FacecastConfig, family: Family, opts: EngineOptions
) -> None:
    wanted = {
        "--compile": opts.compile,
        "--offload": opts.offload,
        "--precision": opts.precision != "default",
    }
    allowed = {
        "--compile": family.compiles,
        "--offload": family.offloads,
        "--precision": family.fp8,
    }
    refused = [flag for flag, on in wanted.items() if on and not allowed[flag]]
    if refused:
        raise ConfigError(
            f"config {cfg.name!r} ({family.summary}): {', '.join(refused)} does not apply to it"
        )


def _placement(
    cfg: FacecastConfig, family: Family, device: torch.device, opts: EngineOptions
) -> Placement | None:
    """The memory cap set, and where the weights go (families that offload; None for the
    others)."""
    from pipeline.offload import OffloadConfig
    from pipeline.placement import plan_placement

    cap = None
    if opts.memory_cap_gb and device.type == "cuda":
        cap = int(opts.memory_cap_gb * 1e9)
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device.index or 0)
    if not family.offloads:
        return None
    offload = (
        OffloadConfig(
            prefetch=opts.prefetch,
            budget_gb=opts.offload_budget_gb,
            record_stalls=opts.record_stalls,
        )
        if opts.offload
        else opts.offload  # False: resident; None: the plan decides
    )
    return plan_placement(cfg, device, offload, memory_cap_bytes=cap)


def freeze_long_lived_objects() -> None:
    """Take what is alive once an engine is warm out of the garbage collector's sight.

    A full collection walks every object the process holds, holding the GIL meanwhile: with
    torch, the model and every import that is ~600,000 objects, 0.2-0.6 s on an idle CPU and
    2 s under load, long enough for the media loop to miss dozens of frame deadlines. What
    exists at this point (modules, weights, the server) lives as long as the process, so it
    is collected once and frozen; later collections see only what sessions make. A frozen
    object still goes when its last reference does; only a cycle of them waits for
    `gc.unfreeze()`, which the process's exit calls (extensions such as nanobind's report
    what was never freed). Thawing when a server stops would make a process that starts
    servers one after another (the tests) walk everything again at each start.
    """
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however many servers this process starts
    atexit.register(gc.unfreeze)
