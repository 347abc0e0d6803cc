"""What every benchmark shares: speech-like audio and a face-like test card (no files), a
clock that times the GPU without host syncs, medians and percentiles, the commit measured.

The diffusion stack's stage benchmark (`facecast bench --config`) is `pipeline.diffusion.bench`;
any family's streaming benchmark (`facecast bench --model`) is `pipeline.stream_bench`; the
quality gate is `pipeline.gate`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

import numpy as np
import torch

from pipeline.clock import MODEL_RATE


# -- input ------------------------------------------------------------------------------------
def speech_like_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """Syllable-rate (~4 Hz) bursts of a voiced source (110–220 Hz harmonics with formant-like
    peaks) and some noise, with pauses: what a speech front end sees, without any speech file."""
    rng = np.random.default_rng(seed)
    n = int(seconds * MODEL_RATE)
    t = np.arange(n) / MODEL_RATE
    pitch = 150 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / MODEL_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    formants = 1 + 0.5 * np.sin(2 * np.pi * 3.1 * t) * np.sin(phase * 4)
    envelope = np.clip(np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6)), 0, None) ** 2
    pauses = (np.sin(2 * np.pi * 0.23 * t) > -0.6).astype(np.float64)
    noise = 0.05 * rng.standard_normal(n)
    x = 0.3 * (voiced * formants / 3 + noise) * envelope * pauses
    return x.astype(np.float32)


def test_card(height: int, width: int) -> np.ndarray:
    """A face-like reference image: gradient, skin oval, eyes, mouth (deterministic)."""
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 2] = (60 + 120 * yy / height).astype(np.uint8)
    face = ((yy - height * 0.5) / (height * 0.35)) ** 2 + (
        (xx - width * 0.5) / (width * 0.22)
    ) ** 2 < 1
    img[face] = (220, 180, 150)
    for ex in (0.43, 0.57):
        eye = ((yy - height * 0.42) ** 2 + (xx - width * ex) ** 2) < (height * 0.03) ** 2
        img[eye] = (30, 30, 40)
    mouth = (np.abs(yy - height * 0.65) < height * 0.02) & (np.abs(xx - width * 0.5) < width * 0.06)
    img[mouth] = (150, 40, 50)
    return img


# -- timing -----------------------------------------------------------------------------------
class Clock:
    """CUDA events on a GPU (no host sync while recording), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def gpu_median_ms(fn, repeats: int, warmup: int = 3):
    """(median milliseconds of `fn()` between CUDA events, its last result), after `warmup`
    calls (compilation, autotuners, caches)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def force_eager():
    """torch.compile'd code runs eagerly inside (to count its FLOPs, or as a baseline)."""
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:
        import contextlib

        return contextlib.nullcontext()
    return stance("force_eager")


def git_commit() -> str:
    """The commit measured: FACECAST_COMMIT where the tree was copied without its history
    (the lent GPU machine), else git's."""
    if os.environ.get("FACECAST_COMMIT"):
        return os.environ["FACECAST_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "pipeline"], capture_output=True,
                               text=True).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
