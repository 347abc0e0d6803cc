"""`run_eval`: score a generated video against the synthetic world's ground truth.

The video is read once, in batches (an MP4 of ten minutes or more never sits in
memory whole); each batch yields per-frame measurements (mouth opening, head
offset, identity distance, frame change), and the scores are computed from those
series at the end. See `metrics.py` for what each measurement is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.clock import FPS
from pipeline.eval import metrics as M
from pipeline.synth.motion import MotionTrack, MouthParams

_BATCH = 64


@dataclass(frozen=True)
class EvalScores:
    """Every score of one generated video. Ground-truth renders score:
    lip_sync ~0.95+ at lag 0, identity_drift ~0, seam_ratio ~1, idle present and bounded.
    """

    n_frames: int
    lip_sync: float  # Pearson r, measured opening vs ground-truth jaw (1 = perfect)
    lip_sync_lag: int  # frames; > 0: the video's mouth is late
    identity_per_minute: list[float]  # mean identity distance to the reference per window
    identity_mean: float
    identity_drift: float  # last window minus first window (0 = no drift)
    seam_ratio: float  # change at seams / change next to them (1 = seamless)
    seam_ratio_global: float  # change at seams / change inside chunks
    n_seams: int
    idle_present: bool
    idle_bounded: bool
    idle_motion: float  # RMS head displacement in silences, fraction of frame width
    idle_change: float  # mean frame change in silences, grey levels
    idle_speed: float  # 95th pct head speed in silences, frame widths per frame
    silence_mouth: float  # mean opening in silence / in speech (0 = closed)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def summary(self) -> str:
        mins = ", ".join(f"{d:.3f}" for d in self.identity_per_minute)
        return "\n".join(
            [
                f"frames            {self.n_frames}",
                f"lip sync          r={self.lip_sync:.3f} at lag {self.lip_sync_lag:+d} frames",
                f"identity          mean {self.identity_mean:.3f}, drift {self.identity_drift:+.3f}"
                f" (per window: {mins})",
                f"seams             ratio {self.seam_ratio:.2f} local, "
                f"{self.seam_ratio_global:.2f} global over {self.n_seams} seams",
                f"idle motion       present={self.idle_present} bounded={self.idle_bounded} "
                f"rms={self.idle_motion:.4f} change={self.idle_change:.2f} "
                f"speed={self.idle_speed:.4f}",
                f"mouth in silence  {self.silence_mouth:.2f} of its speech opening",
            ]
        )


def read_video(path: str | Path, batch: int = _BATCH) -> Iterator[np.ndarray]:
    """Decode a video file to uint8 (n, H, W, 3) RGB batches with PyAV."""
    import av

    with av.open(str(path)) as container:
        buf: list[np.ndarray] = []
        for frame in container.decode(video=0):
            buf.append(frame.to_ndarray(format="rgb24"))
            if len(buf) == batch:
                yield np.stack(buf)
                buf = []
        if buf:
            yield np.stack(buf)


def _batches(video: str | Path | np.ndarray | Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    if isinstance(video, (str, Path)):
        yield from read_video(video)
    elif isinstance(video, np.ndarray):
        for i in range(0, len(video), _BATCH):
            yield video[i : i + _BATCH]
    else:
        for b in video:
            yield from _batches(np.asarray(b))


def _jaw(gt: MouthParams | MotionTrack | np.ndarray) -> np.ndarray:
    if isinstance(gt, (MouthParams, MotionTrack)):
        return np.asarray(gt.jaw, np.float32)
    arr = np.asarray(gt, np.float32)
    # A (N, P) params array from a dataset shard: jaw is column 0.
    return arr[:, 0] if arr.ndim == 2 else arr


@dataclass
class Series:
    """Per-frame measurements of a whole video."""

    opening: np.ndarray
    offsets: np.ndarray
    identity: np.ndarray
    change: np.ndarray


def measure_video(
    video: str | Path | np.ndarray | Iterable[np.ndarray], reference: np.ndarray | None
) -> tuple[Series, M.FaceLayout]:
    """One pass over the video; the reference defaults to the video's first frame."""
    layout = ref_feat = prev = None
    parts: dict[str, list[np.ndarray]] = {
        "opening": [],
        "offsets": [],
        "identity": [],
        "change": [],
    }
    for batch in _batches(video):
        x = M.to_working(batch)
        if layout is None:
            ref = M.to_working(reference if reference is not None else batch[0])
            layout = M.measure_layout(ref[0] * 255.0)
            ref_feat = M.identity_features(ref, np.zeros((1, 2), np.float32), layout)
        assert ref_feat is not None  # measured with the layout, from the first batch
        off = M.register(x, layout)
        parts["offsets"].append(off)
        parts["opening"].append(M.mouth_opening(x, off, layout))
        parts["identity"].append(M.identity_distance(M.identity_features(x, off, layout), ref_feat))
        parts["change"].append(M.frame_change(x, prev))
        prev = x[-1]
    if layout is None:
        raise ValueError("the video has no frames")
    return Series(**{k: np.concatenate(v) for k, v in parts.items()}), layout


def run_eval(
    video: str | Path | np.ndarray | Iterable[np.ndarray],
    gt: MouthParams | MotionTrack | np.ndarray,
    seams: list[int],
    silences: list[tuple[int, int]],
    reference: np.ndarray | None = None,
    *,
    fps: int = FPS,
    window_s: float = 60.0,
    seam_period: int = 1,
) -> EvalScores:
    """Score `video` (frames, batches or a file) against ground truth.

    gt: the ground-truth mouth (MouthParams/MotionTrack, a jaw array (N,), or a
    dataset params array (N, P)); seams: first frame index of each new chunk;
    silences: [start, stop) frame ranges without speech; reference: the identity
    image the video was generated from (defaults to the first frame); seam_period: the
    model's frames per latent, so seams are compared with frames of the same phase
    (`metrics.seam_smoothness`).
    """
    series, layout = measure_video(video, reference)
    n = len(series.opening)
    jaw = _jaw(gt)
    if len(jaw) < n // 2:
        raise ValueError(f"ground truth covers {len(jaw)} frames but the video has {n}")
    r, lag = M.lip_sync(series.opening, jaw[:n])
    windows, drift = M.identity_drift(series.identity, fps, window_s)
    local, global_ = M.seam_smoothness(series.change, seams, period=seam_period)
    idle = M.idle_motion(series.offsets, series.change, series.opening, silences, layout.size)
    return EvalScores(
        n_frames=n,
        lip_sync=r,
        lip_sync_lag=lag,
        identity_per_minute=windows,
        identity_mean=float(np.mean(series.identity)),
        identity_drift=drift,
        seam_ratio=local,
        seam_ratio_global=global_,
        n_seams=len([s for s in seams if 0 < s < n]),
        idle_present=idle.present,
        idle_bounded=idle.bounded,
        idle_motion=idle.motion,
        idle_change=idle.change,
        idle_speed=idle.speed,
        silence_mouth=idle.mouth,
    )
