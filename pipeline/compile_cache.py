"""What `--compile` built, kept in a folder so that the next start on a fresh machine skips it.

A cold `--compile` start of FlashHead Pro takes six minutes and more on an H100, almost all of
it Inductor and Triton compiling kernels; on the same machine a second start takes about one,
because torch finds its own cache in `/tmp`. A new container or a fleet's new worker has no
such cache. `--compile-cache DIR` carries it: at start-up the engine loads the artifacts a
previous start saved there (torch's portable "mega-cache": Inductor's graphs with their
Triton kernels, AOTAutograd's, the autotuning results), and after its warm-up, which compiles
every shape the engine will run, it saves what it holds when something was compiled anew.

The artifacts fit one build of torch on one kind of device: the file's name says which
(`torch-2.11.0+cu130_NVIDIA-H100-80GB-HBM3.bin`), so one folder serves a mixed fleet, each
kind of GPU reading its own file. A file that cannot be read is reported and set aside: the
engine compiles as it would have without it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._dynamo.utils import counters

log = logging.getLogger(__name__)

# Inductor's counters of graphs compiled afresh and found in its cache
_MISSES = ("fxgraph_cache_miss",)
_HITS = ("fxgraph_cache_hit",)


def artifacts_file(folder: str | Path, device: torch.device) -> Path:
    """Where the artifacts of this torch on this kind of device live in `folder`."""
    if device.type == "cuda":
        kind = torch.cuda.get_device_name(device)
    else:
        kind = device.type
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"torch-{torch.__version__}_{kind}").strip("-")
    return Path(folder) / f"{name}.bin"


@dataclass
class CompileCache:
    """One start-up's use of a compile-cache folder: what it found, what it saved."""

    path: Path
    loaded_graphs: int = 0  # Inductor graphs the file held
    misses_before: int = 0
    hits_before: int = 0
    saved_bytes: int | None = None
    error: str | None = None

    @classmethod
    def open(cls, folder: str | Path, device: torch.device) -> CompileCache:
        """Load the folder's artifacts for this device, if there are any (before anything
        is compiled: what is loaded is only looked up when a graph is compiled)."""
        cache = cls(artifacts_file(folder, device))
        cache.misses_before = _count(_MISSES)
        cache.hits_before = _count(_HITS)
        if not cache.path.exists():
            log.info(
                "compile cache: nothing yet at %s; this start compiles and saves there", cache.path
            )
            return cache
        t = time.perf_counter()
        try:
            info = torch.compiler.load_cache_artifacts(cache.path.read_bytes())
            if info is None:  # torch logged why (a checksum, a version) and loaded nothing
                raise ValueError("torch loaded nothing from it")
        except Exception as exc:  # a truncated or foreign file: compile as without it
            cache.error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "compile cache: %s could not be read (%s); compiling without it, and saving "
                "over it once warm",
                cache.path,
                cache.error,
            )
            return cache
        cache.loaded_graphs = len(info.artifacts.get("inductor", []))
        log.info(
            "compile cache: %d graphs loaded from %s in %.1f s",
            cache.loaded_graphs,
            cache.path,
            time.perf_counter() - t,
        )
        return cache

    @property
    def compiled(self) -> int:
        """Graphs compiled afresh since `open` (not found in any cache)."""
        return _count(_MISSES) - self.misses_before

    @property
    def found(self) -> int:
        """Graphs found in a cache since `open` (the folder's, or torch's own in /tmp)."""
        return _count(_HITS) - self.hits_before

    def save(self) -> None:
        """Write what this process compiled and loaded, if anything was compiled afresh or
        the file is missing or unreadable. Written whole or not at all (another process may
        be reading it); a failure is reported, never raised: the engine runs as it is."""
        if self.compiled == 0 and self.path.exists() and self.error is None:
            return
        try:
            saved = torch.compiler.save_cache_artifacts()
            if saved is None:
                return
            data, _ = saved
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            partial.write_bytes(data)
            os.replace(partial, self.path)
        except Exception as exc:
            log.warning("compile cache: could not save to %s: %s", self.path, exc)
            return
        self.saved_bytes = len(data)
        log.info(
            "compile cache: %.1f MB saved to %s (graphs compiled here %d, found in a cache %d)",
            len(data) / 1e6,
            self.path,
            self.compiled,
            self.found,
        )

    def report(self) -> dict:
        """For the start-up report (a bench's JSON under `startup`)."""
        out: dict = {
            "file": str(self.path),
            "graphs_loaded": self.loaded_graphs,
            "graphs_found": self.found,
            "graphs_compiled": self.compiled,
        }
        if self.saved_bytes is not None:
            out["saved_bytes"] = self.saved_bytes
        if self.error is not None:
            out["error"] = self.error
        return out


def _count(names: tuple[str, ...]) -> int:
    return sum(counters["inductor"][name] for name in names)
