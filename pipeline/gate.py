"""The quality gate: proof that a speed change did not change the pixels (DESIGN.md §2).

`facecast gate --config NAME --baseline DIR [candidate options]` renders a fixed input (the
benchmark's synthetic speech and test card) with a fixed seed and compares the frames with
a baseline recorded in DIR:

- recording (DIR has no baseline yet, or --record): the unchanged build renders twice and
  the two runs must hash identical, frame by frame (dual baseline: a nondeterministic
  baseline makes every later comparison meaningless, so the gate refuses it); two more runs
  differ only in reduction order (every linear layer's sum over its input dimension split
  in halves, then in thirds, accumulated in fp32) and set the tier-2 band: their PSNR
  against the baseline is what reassociation alone costs, two samples of that noise.
- checking: tier 1 passes on byte-identical frame hashes; otherwise tier 2 passes when
  1. the candidate's error over the whole render (the PSNR of its mean squared error, all
     frames pooled) is at least the band's minus `tolerance_db`, and
  2. its lowest frame is at least the band's lowest minus the larger of `tolerance_db` and
     the band's spread: how far the two reorderings disagree on any one frame.
  A faster change that falls below the band is rejected.

Why two samples and a pooled error: a stream that feeds its frames back as motion amplifies
rounding at each chunk's seam, so which frame is worst, and by how much, moves from one
sample of the same noise to another. On FlashHead Pro (H100, 2026-12-05) the compiled bf16
build, a pure reordering, was 0.2-0.3 dB closer to the baseline than one reassociation,
mean and pooled, yet its worst frame fell 1.0 dB under that run's worst, and the gate of
one sample rejected it; the second reordering put a seam frame at 28.3 dB where the first
had it at 32.6. The pooled error is steady from sample to sample (37.3 and 37.2 dB there);
the spread lets the worst frame move by what the noise itself moves.

Files in DIR: baseline.json (hashes, band, what was rendered) and frames.npy (uint8).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from pipeline.bench import speech_like_audio, test_card
from pipeline.errors import FacecastError

PSNR_CAP = 100.0  # dB; identical frames (MSE 0) count as this
DEFAULT_TOLERANCE_DB = 0.5
# each linear's sum over its input split in this many parts: two reorderings, two samples of
# the band's noise (DESIGN.md: "two bf16 reassociations of the same model")
REORDERINGS = (2, 3)


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
    # the band's, frame by frame (the lower of the two reorderings'): where this stream's
    # own rounding noise sits
    band_psnr_frames: list[float] = field(default_factory=list)
    # all frames pooled: the PSNR of the mean squared error over the whole render, the
    # candidate's and the band's (None: a baseline recorded before the band was pooled)
    psnr_pooled: float | None = None
    band_psnr_pooled: float | None = None
    # how far the lowest frame may fall under the band's lowest (criterion 2)
    worst_allowance_db: float | None = None
    # the kernels the engine under test chose at start-up ({"self_attention": "fp8"}): a
    # precision's verdict is the verdict on these
    kernels: dict[str, str] = field(default_factory=dict)

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


def psnr_pooled(a: np.ndarray, b: np.ndarray) -> float:
    """The PSNR of the mean squared error over every frame at once (identical: PSNR_CAP)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return PSNR_CAP if mse == 0 else min(PSNR_CAP, 10 * float(np.log10(255.0**2 / mse)))


def band_spread(first: np.ndarray, second: np.ndarray) -> float:
    """How far two samples of the band disagree on one frame, at most (dB): frames either
    run rendered identically (PSNR_CAP) say nothing of the noise and are left out."""
    noisy = (first < PSNR_CAP) & (second < PSNR_CAP)
    return float(np.abs(first - second)[noisy].max()) if noisy.any() else 0.0


@contextmanager
def reassociated(parts: int = 2) -> Iterator[None]:
    """Inside, every F.linear is computed as `parts` products over slices of K summed in
    fp32: the same math in another reduction order (what a different GEMM tiling or split-K
    does). In every thread: an engine may run its steps on a thread of its own (FlashHead's
    step batcher), which a torch function mode, being per thread, never reached (its band
    came out byte-identical: 100 dB)."""
    linear = F.linear

    def split(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        k = w.shape[1]
        if k < parts:
            return linear(x, w, b)
        edges = [k * i // parts for i in range(parts + 1)]
        parts_out = [
            linear(x[..., lo:hi], w[:, lo:hi]).float()
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
        ]
        y = parts_out[0]
        for part in parts_out[1:]:
            y = y + part
        if b is not None:
            y = y + b.float()
        return y.to(x.dtype)

    F.linear = split  # type: ignore[assignment]
    try:
        yield
    finally:
        F.linear = linear


def record_baseline(engine, directory: str | Path, seconds: float = 2.0, seed: int = 0) -> dict:
    """Two identical runs (or FacecastError), two reassociated ones for the band; saved."""
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
    samples, pooled = [], []
    for parts in REORDERINGS:
        with _eager(), reassociated(parts):  # compiled graphs would not see the split
            c = render_fixed(engine, seconds, seed)
        samples.append(psnr_per_frame(a, c))
        pooled.append(psnr_pooled(a, c))
    first, second = samples
    band = np.minimum(first, second)  # frame by frame, the noisier sample's
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
        "band_psnr_pooled": min(pooled),
        "band_spread_db": band_spread(first, second),
        "band_samples_psnr_frames": [[round(float(x), 2) for x in p] for p in samples],
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
    pooled = psnr_pooled(baseline_frames, frames)
    band = baseline_meta["band_psnr_min"]
    # a baseline recorded before the band had two samples: its worst frame, one sample's,
    # with the tolerance alone, and no pooled criterion (`--record` again for both)
    band_pooled = baseline_meta.get("band_psnr_pooled")
    allowance = max(tolerance_db, baseline_meta.get("band_spread_db", 0.0))
    threshold = band - allowance
    common = dict(
        frames=len(frames),
        identical_frames=identical,
        psnr_min=float(psnr.min()),
        psnr_mean=float(psnr.mean()),
        band_psnr_min=band,
        threshold_db=threshold,
        psnr_frames=[round(float(x), 2) for x in psnr],
        band_psnr_frames=baseline_meta.get("band_psnr_frames", []),
        psnr_pooled=pooled,
        band_psnr_pooled=band_pooled,
        worst_allowance_db=allowance,
    )
    if hashes == baseline_meta["hashes"]:
        return GateReport(True, 1, message="tier 1: every frame byte-identical", **common)
    worst = int(np.argmin(psnr))
    pooled_line = (
        "" if band_pooled is None else f"pooled {pooled:.2f} dB (band {band_pooled:.2f}), "
    )
    worst_line = f"lowest frame {worst} at {psnr[worst]:.2f} dB (band {band:.2f} - {allowance:.2f})"
    spread_line = (
        "the baseline has one reordering: --record again for two"
        if band_pooled is None
        else f"the band's two reorderings {baseline_meta['band_spread_db']:.2f} dB apart at most"
    )
    if band_pooled is not None and pooled < band_pooled - tolerance_db:
        return GateReport(
            False,
            None,
            message=f"rejected: the error over all frames, pooled {pooled:.2f} dB, is below the "
            f"band {band_pooled:.2f} - {tolerance_db} dB; {worst_line}",
            **common,
        )
    if psnr.min() >= threshold:
        return GateReport(
            True,
            2,
            message=f"tier 2: {pooled_line}{worst_line}; {identical}/{len(frames)} frames "
            f"identical; {spread_line}",
            **common,
        )
    return GateReport(
        False,
        None,
        message=f"rejected: frame {worst} at {psnr[worst]:.2f} dB is below the band {band:.2f} - "
        f"{allowance:.2f} dB ({pooled_line}{spread_line})",
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
    it passes on its own floor: its error over all frames (pooled) at least `floor_db`, and
    its lowest frame at least `floor_db` too, or, where bf16's own reorderings already put a
    frame under the floor, at least the band's lowest less its spread. The report says how
    far below the band it sits.

    A stream that amplifies rounding at its seams can leave bf16 itself under the floor: on
    FlashHead Pro (H100, 2026-12-05) one reordering of bf16's sums put a seam frame at
    28.3 dB, so a floor on the lowest frame alone rejected bf16 as surely as FP8; the pooled
    error still tells them apart (bf16's reorderings 37.2 dB, FP8 34.5)."""
    allowance = report.worst_allowance_db
    if allowance is None:  # a report made without `compare` (no band spread known)
        allowance = DEFAULT_TOLERANCE_DB
    worst_floor = min(floor_db, report.band_psnr_min - allowance)
    pooled = report.psnr_pooled
    passed = report.psnr_min >= worst_floor and (pooled is None or pooled >= floor_db)
    verdict = "precision tier: pass" if passed else "precision tier: rejected"
    # PSNR is log RMS error: the error as a multiple of reassociation's, pooled where the
    # baseline has the band pooled, else the worst frames'
    if pooled is not None and report.band_psnr_pooled is not None:
        ratio = 10 ** ((report.band_psnr_pooled - pooled) / 20)
        band = report.band_psnr_pooled
        against = f"pooled {pooled:.2f} dB (floor {floor_db:.1f}; the band {band:.2f}: "
    else:
        ratio = 10 ** ((report.band_psnr_min - report.psnr_min) / 20)
        against = f"against the band's lowest {report.band_psnr_min:.2f} dB ("
    lowest = f"lowest frame {report.psnr_min:.2f} dB (floor {worst_floor:.2f}"
    if worst_floor < floor_db:
        lowest += (
            f": the band's lowest {report.band_psnr_min:.2f} less {allowance:.2f}, bf16's own "
            f"reordering already under {floor_db:.1f}"
        )
    return replace(
        report,
        passed=passed,
        tier=3 if passed else None,
        threshold_db=worst_floor,
        message=f"{verdict}: {against}{ratio:.2f}x its error), {lowest}), mean "
        f"{report.psnr_mean:.2f} dB, against the bf16 baseline",
    )
