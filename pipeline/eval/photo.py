"""`facecast eval --photo`: how well a video of a real photo keeps it and follows speech.

The measurement of issue 16, for any stack (demo, photo, …) and any real portrait:

- the photo is framed as the photo stack shows it (`pipeline.photo.reference`): scaled to
  cover the frame, centre-cropped, and the crop slid the least that keeps the face in (a
  portrait photo in a 16:9 frame would lose the head to a plain centre crop; on the square
  CPU default the two are the same);
- the face box and its roll are the photo stack's own (`pipeline.photo.face`: the face
  BlazeFace finds, measured by FaceMesh's landmarks; a synthetic reference's world
  geometry; a photo framed by hand, `--face-box` as it was rendered, the face inside that
  box). The mouth box is its lower 40 % × middle 60 %, turned with the face;
- identity: per frame, mean SSIM (Gaussian window, sigma 1.5, on luma) against the framed
  photo over every pixel outside the mouth box; drift = mean of the last `window_s`
  seconds minus the first;
- lip sync: per frame, mouth motion = mean absolute luma difference between the frame's
  mouth box and the photo's; the speech envelope = RMS of the frame's 40 ms of audio;
  Pearson r between the two (at lag 0, and the best within ±3 frames);
- a face is detectable: the detector on every 25th frame finds a face overlapping the
  photo's face box (IoU > 0.3); the share of such frames. Not for a photo framed by hand:
  the detector missing it is why it was framed by hand, so the face in the given box is
  scored and the summary says so;
- chunk seams, given the model that made the video (`--model`: FlashHead's 28-frame chunks,
  say): the mean absolute luma change into each seam's first frame over the change at the
  same latent phase around it (`metrics.seam_smoothness`; 1 = seamless).

The video is read in batches; only per-frame numbers are kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from pipeline.clock import FPS, MODEL_SAMPLES_PER_FRAME
from pipeline.config import PhotoConfig
from pipeline.errors import MediaError
from pipeline.eval.evaluate import _batches
from pipeline.eval.metrics import seam_smoothness
from pipeline.faces.face_box import FaceBox
from pipeline.faces.finder import detect_faces
from pipeline.photo.face import read_photo_file
from pipeline.photo.reference import prepare_reference

# scoring takes any face the photo stack would, and smaller ones: the video is given
SCORING = PhotoConfig(min_face_px=1)


@dataclass(frozen=True)
class PhotoScores:
    n_frames: int
    ssim_outside_mouth: float  # mean over frames (1 = the photo itself)
    ssim_first_window: float
    ssim_last_window: float
    identity_drift: float  # last window minus first (0 = no drift)
    mouth_speech_r: float  # Pearson r, mouth motion vs speech envelope, lag 0
    mouth_speech_r_best: float  # the best r within ±3 frames
    best_lag: int  # frames; > 0: the mouth follows the sound late
    face_detected: float | None  # share of sampled frames with the face found (None: by hand)
    face_box: list[float]
    mouth_box: list[int]  # upright, before the face's roll turns it
    # the model's chunk seams (`facecast eval --model`): the frame-to-frame change at a seam
    # over the change at the same latent phase near it (1 = seamless); None without seams
    seam_ratio: float | None = None
    seam_ratio_global: float | None = None
    n_seams: int = 0
    face_roll_deg: float = 0.0
    face_box_by_hand: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def summary(self) -> str:
        return "\n".join(
            [
                f"frames              {self.n_frames}",
                f"SSIM outside mouth  {self.ssim_outside_mouth:.3f} (first window "
                f"{self.ssim_first_window:.3f}, last {self.ssim_last_window:.3f}, drift "
                f"{self.identity_drift:+.3f})",
                f"mouth vs speech     r={self.mouth_speech_r:.3f} at lag 0, best "
                f"{self.mouth_speech_r_best:.3f} at lag {self.best_lag:+d}",
                self._face_line(),
            ]
            + (
                [
                    f"seams               ratio {self.seam_ratio:.2f} local, "
                    f"{self.seam_ratio_global:.2f} global over {self.n_seams} seams"
                ]
                if self.seam_ratio is not None and self.seam_ratio_global is not None
                else []
            )
        )

    def _face_line(self) -> str:
        box = ",".join(f"{v:.0f}" for v in self.face_box)
        if self.face_box_by_hand or self.face_detected is None:
            return (
                f"face                framed by hand: scored inside the given box ({box} in "
                f"video pixels, roll {self.face_roll_deg:+.0f} deg), no detector re-run"
            )
        return f"face detected       {self.face_detected:.0%} of sampled frames"


def luma(rgb: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY).astype(np.float64)


def ssim_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-pixel SSIM of two luma images (0..255), Gaussian window sigma 1.5 (Wang 2004)."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    blur = lambda x: cv2.GaussianBlur(x, (11, 11), 1.5)  # noqa: E731
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    return ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / (
        (mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2)
    )


def speech_envelope(samples_16k: np.ndarray, n_frames: int) -> np.ndarray:
    x = np.asarray(samples_16k, np.float64).reshape(-1)
    x = np.pad(x, (0, max(0, n_frames * MODEL_SAMPLES_PER_FRAME - len(x))))
    return np.sqrt(
        (x[: n_frames * MODEL_SAMPLES_PER_FRAME].reshape(n_frames, -1) ** 2).mean(axis=1)
    )


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def _iou(a, b) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    iw = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    ih = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = iw * ih
    return inter / (aw * ah + bw * bh - inter)


def framed_photo(
    photo: str | Path, width: int, height: int, face_box: FaceBox | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    """The photo file as a `width` x `height` video shows it at rest, the face box the
    scores use (x, y, w, h) and the face's roll (radians); `face_box` (photo pixels) frames
    it by hand, as render did."""
    data = read_photo_file(str(photo), SCORING)
    prepared = prepare_reference(data, str(photo), width, height, SCORING, face_box)
    return prepared.framed, np.array(prepared.face.box), prepared.face.roll


def mouth_mask(shape: tuple[int, ...], box: np.ndarray, roll: float) -> np.ndarray:
    """The face box's lower 40 % x middle 60 %, turned by the face's roll about the box's
    centre: (H, W) bool."""
    x, y, w, h = box
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]] + 0.5
    dx, dy = xx - (x + w / 2), yy - (y + h / 2)
    u = np.cos(roll) * dx + np.sin(roll) * dy  # into the face's frame
    v = -np.sin(roll) * dx + np.cos(roll) * dy
    return (np.abs(u) <= 0.3 * w) & (v >= 0.1 * h) & (v <= 0.5 * h)


def run_photo_eval(
    video,
    photo: str | Path,
    audio_16k: np.ndarray,
    window_s: float = 10.0,
    face_box: FaceBox | None = None,
    seams_for: Callable[[int], list[int]] | None = None,
    seam_period: int = 1,
    by_hand: bool | None = None,
) -> PhotoScores:
    """Score `video` (a file, frames or batches) against the photo file it animates.
    `seams_for(n)`: the chunk seams of an n-frame video of the model that made it, scored
    against frames `seam_period` (its VAE's frames per latent) apart. `by_hand` (default:
    a `face_box` was given): the face was framed by hand, so no detector is re-run."""
    by_hand = face_box is not None if by_hand is None else by_hand
    ref = framed = box = previous = None
    mask = None
    roll = 0.0
    ssim, motion, found, change = [], [], [], []
    n = 0
    for batch in _batches(video):
        if framed is None:
            H, W = batch.shape[1:3]
            framed, box, roll = framed_photo(photo, W, H, face_box)
            x, y, w, h = box
            mb = (
                int(x + 0.2 * w),
                int(y + 0.6 * h),
                int(np.ceil(x + 0.8 * w)),
                int(np.ceil(y + h)),
            )
            mask = mouth_mask((H, W), box, roll)
            ref = luma(framed)
        assert ref is not None and mask is not None and box is not None
        for frame in batch:
            g = luma(frame)
            change.append(np.nan if previous is None else float(np.abs(g - previous).mean()))
            previous = g
            ssim.append(float(ssim_map(g, ref)[~mask].mean()))
            motion.append(float(np.abs(g - ref)[mask].mean()))
            if n % FPS == 0 and not by_hand:
                hits = detect_faces(frame)
                found.append(any(_iou(f, box) > 0.3 for f in hits))
            n += 1
    if n == 0 or box is None:
        raise MediaError("the video has no frames")
    ssim_a, motion_a = np.array(ssim), np.array(motion)
    env = speech_envelope(audio_16k, n)
    r0 = _pearson(motion_a, env)
    lags = {
        lag: _pearson(motion_a[max(0, lag) : n + min(0, lag)], env[max(0, -lag) : n - max(0, lag)])
        for lag in range(-3, 4)
    }
    best = max(lags, key=lambda lag: lags[lag])
    win = max(1, min(n // 2, int(window_s * FPS)))
    first, last = float(ssim_a[:win].mean()), float(ssim_a[-win:].mean())
    seams = [s for s in seams_for(n) if 0 < s < n] if seams_for else []
    seam_ratio = seam_global = None
    if seams:
        seam_ratio, seam_global = seam_smoothness(np.array(change), seams, period=seam_period)
    return PhotoScores(
        n_frames=n,
        ssim_outside_mouth=float(ssim_a.mean()),
        ssim_first_window=first,
        ssim_last_window=last,
        identity_drift=last - first,
        mouth_speech_r=r0,
        mouth_speech_r_best=lags[best],
        best_lag=best,
        face_detected=None if by_hand else float(np.mean(found)),
        face_box=[float(v) for v in box],
        mouth_box=list(mb),
        seam_ratio=seam_ratio,
        seam_ratio_global=seam_global,
        n_seams=len(seams),
        face_roll_deg=float(np.degrees(roll)),
        face_box_by_hand=by_hand,
    )


def face_strip(
    video,
    photo: str | Path,
    scores: PhotoScores,
    n: int = 8,
    side: int = 192,
    face_box: FaceBox | None = None,
):
    """The framed photo, then `n` frames spread over the clip, each cropped around the face
    (1.8x the face box) and scaled to `side` pixels: what a person looks at first."""
    picks = set(np.linspace(12, scores.n_frames - 1, n).astype(int).tolist())
    x, y, w, h = scores.face_box
    half = 0.9 * max(w, h)
    cx, cy = x + w / 2, y + 0.55 * h
    tiles, framed = [], None
    for i, frame in enumerate(f for batch in _batches(video) for f in batch):
        if framed is None:
            framed, _, _ = framed_photo(photo, frame.shape[1], frame.shape[0], face_box)
            tiles.append(_crop(framed, cx, cy, half, side))
        if i in picks:
            tiles.append(_crop(frame, cx, cy, half, side))
    return np.concatenate(tiles, axis=1)


def _crop(rgb: np.ndarray, cx: float, cy: float, half: float, side: int) -> np.ndarray:
    H, W = rgb.shape[:2]
    x0, y0 = int(max(0, cx - half)), int(max(0, cy - half))
    x1, y1 = int(min(W, cx + half)), int(min(H, cy + half))
    return cv2.resize(
        np.ascontiguousarray(rgb[y0:y1, x0:x1]), (side, side), interpolation=cv2.INTER_CUBIC
    )


def write_json(scores: PhotoScores, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scores.to_json())
