"""The quality gate: proof that a speed change did not change the pixels (DESIGN.md §2).

`facecast gate --config NAME --baseline DIR [candidate options]` renders a fixed input (the
benchmark's synthetic speech and test card) with a fixed seed and compares the frames with
a baseline recorded in DIR:

- recording (DIR has no baseline yet, or --record): the unchanged build renders twice and
  the two runs must hash identical, frame by frame (dual baseline: a nondeterministic
  baseline makes every later comparison meaningless, so the gate refuses it); a third run
  differs only in reduction order (every linear layer's sum over its input dimension split
  in two halves, accumulated in fp32) and sets the tier-2 band: its PSNR against the
  baseline is what reassociation alone costs.
- checking: tier 1 passes on byte-identical frame hashes; otherwise tier 2 passes when the
  candidate's lowest per-frame PSNR is at least the band's lowest minus `tolerance_db`.
  A faster change that falls below the band is rejected.

Files in DIR: baseline.json (hashes, band, what was rendered) and frames.npy (uint8).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from pipeline.bench import speech_like_audio, test_card
from pipeline.errors import FacecastError

PSNR_CAP = 100.0  # dB; identical frames (MSE 0) count as this
DEFAULT_TOLERANCE_DB = 0.5


@dataclass
class GateReport:
    passed: bool
    tier: int | None  # 1: identical, 2: within the band, None: failed
    frames: int
    identical_frames: int
    psnr_min: float
    psnr_mean: float
    band_psnr_min: float
    threshold_db: float
    message: str
    # each frame's PSNR against the baseline, in order: whether a loss grows from chunk to
    # chunk (a stream feeds its own frames back as motion) or stays put
    psnr_frames: list[float] = field(default_factory=list)
    # the reassociated run's, frame by frame: where this stream's own rounding noise sits
    band_psnr_frames: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def render_fixed(engine, seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """The gate's fixed input through one session: uint8 frames (N, H, W, 3)."""
    v = engine.cfg.video
    session = engine.new_stream(test_card(v.height, v.width), seed=seed)
    try:
        session.push_audio(speech_like_audio(seconds, seed=1234))
        batches = session.generate_ready() + session.finish()
    finally:
        session.close()
    return np.concatenate([b.frames for b in batches])


def frame_hashes(frames: np.ndarray) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(f).tobytes()).hexdigest()[:32] for f in frames]


def psnr_per_frame(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape != b.shape:
        raise FacecastError(
            f"frames differ in shape: baseline {a.shape} vs candidate {b.shape}; "
            "record a new baseline for this config and length"
        )
    diff = a.astype(np.float64) - b.astype(np.float64)
    mse = (diff**2).reshape(len(a), -1).mean(axis=1)
    with np.errstate(divide="ignore"):
        psnr = 10 * np.log10(255.0**2 / mse)
    return np.minimum(psnr, PSNR_CAP)


@contextmanager
def reassociated() -> Iterator[None]:
    """Inside, every F.linear is computed as two half-K products summed in fp32: the same
    math in another reduction order (what a different GEMM tiling or split-K does). In
    every thread: an engine may run its steps on a thread of its own (FlashHead's step
    batcher), which a torch function mode, being per thread, never reached (its band came
    out byte-identical: 100 dB)."""
    linear = F.linear

    def split(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        k = w.shape[1]
        if k < 2:
            return linear(x, w, b)
        h = k // 2
        y = linear(x[..., :h], w[:, :h]).float() + linear(x[..., h:], w[:, h:]).float()
        if b is not None:
            y = y + b.float()
        return y.to(x.dtype)

    F.linear = split  # type: ignore[assignment]
    try:
        yield
    finally:
        F.linear = linear


def record_baseline(engine, directory: str | Path, seconds: float = 2.0, seed: int = 0) -> dict:
    """Two identical runs (or FacecastError), one reassociated run for the band; saved."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    a = render_fixed(engine, seconds, seed)
    b = render_fixed(engine, seconds, seed)
    ha, hb = frame_hashes(a), frame_hashes(b)
    if ha != hb:
        bad = sum(x != y for x, y in zip(ha, hb, strict=True))
        raise FacecastError(
            f"dual baseline failed: two runs of the same build differ in {bad} of {len(ha)} "
            "frames, so no delta can be trusted; make the baseline deterministic first"
        )
    with _eager(), reassociated():  # compiled graphs would not see the split
        c = render_fixed(engine, seconds, seed)
    band = psnr_per_frame(a, c)
    meta = {
        "config": engine.cfg.name,
        "seconds": seconds,
        "seed": seed,
        "frames": len(a),
        "hashes": ha,
        "band_psnr_min": float(band.min()),
        "band_psnr_mean": float(band.mean()),
        "band_identical_frames": int((band >= PSNR_CAP).sum()),
        "band_psnr_frames": [round(float(x), 2) for x in band],
        "attention": engine.cfg.runtime.attention,
        "dtype": engine.cfg.runtime.dtype,
        "device": str(engine.device),
    }
    np.save(d / "frames.npy", a)
    (d / "baseline.json").write_text(json.dumps(meta, indent=2))
    return meta


def _eager():
    from pipeline.bench import force_eager

    return force_eager()


def has_baseline(directory: str | Path) -> bool:
    d = Path(directory)
    return (d / "baseline.json").is_file() and (d / "frames.npy").is_file()


def compare(
    baseline_meta: dict,
    baseline_frames: np.ndarray,
    frames: np.ndarray,
    tolerance_db: float = DEFAULT_TOLERANCE_DB,
) -> GateReport:
    hashes = frame_hashes(frames)
    identical = sum(x == y for x, y in zip(hashes, baseline_meta["hashes"], strict=False))
    psnr = psnr_per_frame(baseline_frames, frames)
    band = baseline_meta["band_psnr_min"]
    threshold = band - tolerance_db
    common = dict(
        frames=len(frames),
        identical_frames=identical,
        psnr_min=float(psnr.min()),
        psnr_mean=float(psnr.mean()),
        band_psnr_min=band,
        threshold_db=threshold,
        psnr_frames=[round(float(x), 2) for x in psnr],
        band_psnr_frames=baseline_meta.get("band_psnr_frames", []),
    )
    if hashes == baseline_meta["hashes"]:
        return GateReport(True, 1, message="tier 1: every frame byte-identical", **common)
    if psnr.min() >= threshold:
        return GateReport(
            True,
            2,
            message=f"tier 2: lowest PSNR {psnr.min():.2f} dB >= band {band:.2f} - "
            f"{tolerance_db} dB ({identical}/{len(frames)} frames identical)",
            **common,
        )
    worst = int(np.argmin(psnr))
    return GateReport(
        False,
        None,
        message=f"rejected: frame {worst} at {psnr[worst]:.2f} dB is below the band "
        f"{band:.2f} - {tolerance_db} dB",
        **common,
    )


def check(engine, directory: str | Path, tolerance_db: float = DEFAULT_TOLERANCE_DB) -> GateReport:
    d = Path(directory)
    if not has_baseline(d):
        raise FacecastError(f"no baseline in {d}: run `facecast gate --record` first")
    meta = json.loads((d / "baseline.json").read_text())
    if meta["config"] != engine.cfg.name:
        raise FacecastError(
            f"baseline in {d} is for config {meta['config']!r}, not {engine.cfg.name!r}"
        )
    frames = render_fixed(engine, meta["seconds"], meta["seed"])
    return compare(meta, np.load(d / "frames.npy"), frames, tolerance_db)


def precision_tier(report: GateReport, floor_db: float) -> GateReport:
    """The tier of a lower precision (FP8): it cannot meet the bf16 reassociation band, so
    it passes on its own floor, and the report says how far below the band it sits."""
    passed = report.psnr_min >= floor_db
    verdict = "precision tier: pass" if passed else "precision tier: rejected"
    # PSNR is log RMS error: the worst frame's error as a multiple of reassociation's worst
    ratio = 10 ** ((report.band_psnr_min - report.psnr_min) / 20)
    return GateReport(
        passed,
        3 if passed else None,
        report.frames,
        report.identical_frames,
        report.psnr_min,
        report.psnr_mean,
        report.band_psnr_min,
        floor_db,
        message=f"{verdict}: lowest PSNR {report.psnr_min:.2f} dB, mean {report.psnr_mean:.2f} "
        f"dB against the bf16 baseline (floor {floor_db:.1f} dB; the bf16 reassociation band "
        f"is {report.band_psnr_min:.2f} dB: {ratio:.2f}x its error)",
        psnr_frames=report.psnr_frames,
        band_psnr_frames=report.band_psnr_frames,
    )
