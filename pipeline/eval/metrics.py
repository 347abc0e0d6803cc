"""Quality metrics measured on generated frames alone, against the synthetic world.

Nothing here reads the renderer's internal parameters: every per-frame quantity is
measured from pixels, using only the reference image to learn the person's layout.

How a frame is measured (working resolution WORK x WORK, RGB in [0, 1]):

- Layout (once, from the reference): the skin colour is the median of two cheek
  patches at the synthetic world's known framing (face centred, cheeks at +-0.2 of
  the frame half-width, just below the frame centre); the lip colour and the mouth
  centre come from the pixels below the nose that are redder than skin.
- Face position: a soft skin mask (chromaticity close to the skin's, brightness
  within a shading range) is cross-correlated (FFT) with the reference's mask; the
  peak, refined to sub-pixel by a parabola, is the head's translation. Head roll is
  small in this world and is not estimated.
- Mouth opening: inside a mouth window that follows the face, the area of pixels
  darker than 60% of the darker of lips and skin (the inner mouth) or bright and unsaturated
  (teeth), divided by the frame area; lips and skin are neither.
- Identity features: an 8x8 RGB thumbnail of the upper face (above the mouth
  window, aligned by the face position) and a 4x4x4 colour histogram of the head
  region without the mouth. Distance = RMS thumbnail difference + half the L1
  histogram difference (both in [0, ~1]).
- Frame change: mean absolute RGB difference between consecutive frames.
- Corner error: mean absolute RGB error of the bottom-left `CORNER` pixels against a
  target (the ground-truth render, or the reference), beside the error everywhere else, at
  the video's own resolution: the demo VAE decoder saturates that corner (bench/RESULTS.md).

Shapes: N frames, S = WORK pixels a side.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.clock import FPS

WORK = 128  # metrics run at this resolution whatever the video size


def to_working(frames: np.ndarray, size: int = WORK) -> np.ndarray:
    """uint8 (N, H, W, 3) or (H, W, 3) -> float32 (N, size, size, 3) in [0, 1].

    A non-square frame is centre-cropped to a square first (the synthetic world is
    framed square). Integer downscales average pixel blocks; other ratios sample
    bilinearly.
    """
    x = np.asarray(frames)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected frames (N, H, W, 3), got shape {x.shape}")
    n, h, w, _ = x.shape
    side = min(h, w)
    x = x[:, (h - side) // 2 : (h - side) // 2 + side, (w - side) // 2 : (w - side) // 2 + side]
    x = x.astype(np.float32) / 255.0
    if side == size:
        return x
    if side % size == 0:
        f = side // size
        return x.reshape(n, size, f, size, f, 3).mean(axis=(2, 4))
    pos = (np.arange(size) + 0.5) * side / size - 0.5
    i0 = np.clip(np.floor(pos).astype(int), 0, side - 1)
    i1 = np.clip(i0 + 1, 0, side - 1)
    t = np.clip(pos - i0, 0, 1).astype(np.float32)
    rows = x[:, i0] * (1 - t)[None, :, None, None] + x[:, i1] * t[None, :, None, None]
    return rows[:, :, i0] * (1 - t)[None, None, :, None] + rows[:, :, i1] * t[None, None, :, None]


def _lum(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=-1)


def _chroma(x: np.ndarray) -> np.ndarray:
    return x / (x.sum(axis=-1, keepdims=True) + 1e-4)


@dataclass(frozen=True)
class FaceLayout:
    """What the metrics know about the person, all measured from the reference."""

    skin: np.ndarray  # (3,) RGB
    lips: np.ndarray  # (3,) RGB
    mask: np.ndarray  # (S, S) soft skin mask of the reference
    mouth: tuple[int, int]  # (x, y) mouth centre, pixels
    mouth_box: tuple[int, int, int, int]  # (x0, y0, x1, y1) relative to the mouth centre
    upper_box: tuple[int, int, int, int]  # (x0, y0, x1, y1) upper face, absolute pixels
    size: int
    closed: float = 0.0  # opening measured on the reference (closed lips' seam line)


def skin_mask(x: np.ndarray, skin: np.ndarray) -> np.ndarray:
    """Soft skin mask (..., S, S) in [0, 1]: skin-like chromaticity and brightness."""
    d = np.abs(_chroma(x) - _chroma(skin)).sum(axis=-1)
    ratio = _lum(x) / (_lum(skin) + 1e-4)
    bright = np.clip((ratio - 0.55) / 0.1, 0, 1) * np.clip((1.35 - ratio) / 0.1, 0, 1)
    return np.clip((0.09 - d) / 0.04, 0, 1) * bright


def measure_layout(reference: np.ndarray, size: int = WORK) -> FaceLayout:
    """Learn skin, lips and the mouth position from a reference image (H, W, 3)."""
    ref = to_working(reference, size)[0]
    s = size
    patches = [
        ref[int(0.52 * s) - 3 : int(0.52 * s) + 3, c - 3 : c + 3].reshape(-1, 3)
        for c in (int(0.4 * s), int(0.6 * s))
    ]
    skin = np.median(np.concatenate(patches), axis=0)
    mask = skin_mask(ref, skin)
    # Refine: the median of everything the first guess calls skin near the centre.
    core = mask[int(0.3 * s) : int(0.7 * s), int(0.3 * s) : int(0.7 * s)] > 0.5
    if core.sum() > 20:
        skin = np.median(
            ref[int(0.3 * s) : int(0.7 * s), int(0.3 * s) : int(0.7 * s)][core], axis=0
        )
        mask = skin_mask(ref, skin)

    # Lips: clearly redder than skin, below the nose, near the centre line. Red hair
    # can reach into this window beside the chin, so keep only the band of rows
    # around the strongest lip row.
    y0, y1, x0, x1 = int(0.55 * s), int(0.72 * s), int(0.42 * s), int(0.58 * s)
    win = ref[y0:y1, x0:x1]
    redder = _chroma(win)[..., 0] - _chroma(skin)[0]
    lip_w = np.clip((redder - 0.04) / 0.03, 0, 1) * (_lum(win) > 0.05)
    rows = lip_w.sum(axis=1)
    if rows.max() < 2:
        raise ValueError(
            "could not find the lips in the reference image; metrics need a reference "
            "from the synthetic face world (facecast make-reference)"
        )
    peak = int(rows.argmax())
    band = np.zeros_like(rows)
    band[max(0, peak - s // 32) : peak + s // 32 + 1] = 1
    lip_w = lip_w * band[:, None]
    yy, xx = np.mgrid[y0:y1, x0:x1]
    my = int(round(float((yy * lip_w).sum() / lip_w.sum())))
    mx = int(round(float((xx * lip_w).sum() / lip_w.sum())))
    strong = lip_w > 0.99
    lips = np.median(win[strong], axis=0) if strong.sum() >= 3 else win[lip_w > 0].mean(axis=0)
    # Mouth window in frame units of the world: +-0.26 wide (mouth plus yaw shift),
    # from just above the upper lip to past the fully dropped lower lip.
    half = s / 2
    mouth_box = (-int(0.26 * half), -int(0.035 * half), int(0.26 * half), int(0.24 * half))
    upper_box = (int(0.25 * s), int(0.18 * s), int(0.75 * s), my - int(0.05 * half))
    layout = FaceLayout(skin, lips, mask, (mx, my), mouth_box, upper_box, size)
    zero = np.zeros((1, 2), np.float32)
    closed = float(mouth_opening(ref[None], zero, layout)[0])
    return FaceLayout(skin, lips, mask, (mx, my), mouth_box, upper_box, size, closed)


def register(x: np.ndarray, layout: FaceLayout, max_shift: int = 16) -> np.ndarray:
    """Head translation of each frame relative to the reference: (N, 2) (dx, dy) px."""
    m = skin_mask(x, layout.skin)
    ref = layout.mask - layout.mask.mean()
    m = m - m.mean(axis=(1, 2), keepdims=True)
    spec = np.fft.rfft2(m) * np.conj(np.fft.rfft2(ref))[None]
    corr = np.fft.irfft2(spec, s=ref.shape)
    corr = np.fft.fftshift(corr, axes=(1, 2))
    c = ref.shape[0] // 2
    win = corr[:, c - max_shift : c + max_shift + 1, c - max_shift : c + max_shift + 1]
    n, k = win.shape[0], win.shape[1]
    flat = win.reshape(n, -1).argmax(axis=1)
    iy, ix = np.clip(flat // k, 1, k - 2), np.clip(flat % k, 1, k - 2)
    idx = np.arange(n)

    def refine(lo, mid, hi):
        den = lo - 2 * mid + hi
        return np.where(np.abs(den) > 1e-9, 0.5 * (lo - hi) / np.where(den == 0, 1, den), 0.0)

    fy = refine(win[idx, iy - 1, ix], win[idx, iy, ix], win[idx, iy + 1, ix])
    fx = refine(win[idx, iy, ix - 1], win[idx, iy, ix], win[idx, iy, ix + 1])
    dx = ix + np.clip(fx, -0.5, 0.5) - max_shift
    dy = iy + np.clip(fy, -0.5, 0.5) - max_shift
    return np.stack([dx, dy], axis=1).astype(np.float32)


def _window(x: np.ndarray, box: tuple[int, int, int, int], offset: np.ndarray) -> np.ndarray:
    """Crop the same box, shifted by each frame's integer offset: (N, h, w, 3)."""
    x0, y0, x1, y1 = box
    s = x.shape[1]
    out = np.zeros((len(x), y1 - y0, x1 - x0, 3), np.float32)
    for i, (dx, dy) in enumerate(np.round(offset).astype(int)):
        ya, yb, xa, xb = y0 + dy, y1 + dy, x0 + dx, x1 + dx
        ca, cb = max(0, -ya), (y1 - y0) - max(0, yb - s)
        ra, rb = max(0, -xa), (x1 - x0) - max(0, xb - s)
        out[i, ca:cb, ra:rb] = x[i, max(0, ya) : min(s, yb), max(0, xa) : min(s, xb)]
    return out


def _mouth_abs(layout: FaceLayout) -> tuple[int, int, int, int]:
    mx, my = layout.mouth
    x0, y0, x1, y1 = layout.mouth_box
    return (mx + x0, my + y0, mx + x1, my + y1)


def mouth_opening(x: np.ndarray, offsets: np.ndarray, layout: FaceLayout) -> np.ndarray:
    """Open-mouth area per frame (N,), a fraction of the frame area; 0 = as closed
    as the reference."""
    win = _window(x, _mouth_abs(layout), offsets)
    lum = _lum(win)
    # Darker than 60% of the darker of lips and skin: the inner mouth.
    ref_lum = min(float(_lum(layout.lips)), float(_lum(layout.skin)))
    dark = np.clip((0.6 * ref_lum - lum) / (0.15 * ref_lum + 1e-3), 0, 1)
    sat = (win.max(axis=-1) - win.min(axis=-1)) / (win.max(axis=-1) + 1e-3)
    skin_sat = float((layout.skin.max() - layout.skin.min()) / (layout.skin.max() + 1e-3))
    # Teeth: bright and clearly less saturated than this person's skin.
    teeth = np.clip((lum - 0.5) / 0.1, 0, 1) * np.clip((0.7 * skin_sat - sat) / 0.04, 0, 1)
    area = np.clip(dark + teeth, 0, 1).sum(axis=(1, 2))
    return (area / (layout.size * layout.size) - layout.closed).astype(np.float32)


def identity_features(x: np.ndarray, offsets: np.ndarray, layout: FaceLayout) -> np.ndarray:
    """(N, 192 + 64) identity descriptor; compare with `identity_distance`."""
    up = _window(x, layout.upper_box, offsets)
    n, h, w, _ = up.shape
    th, tw = h // 8 * 8, w // 8 * 8
    thumb = up[:, :th, :tw].reshape(n, 8, th // 8, 8, tw // 8, 3).mean(axis=(2, 4))
    # Colour histogram of the head region (upper face box widened), mouth excluded.
    x0, y0, x1, y1 = layout.upper_box
    s = layout.size
    head = _window(x, (max(0, x0 - s // 8), max(0, y0 - s // 8), min(s, x1 + s // 8), y1), offsets)
    q = np.clip((head * 4).astype(np.int32), 0, 3)
    code = (q[..., 0] * 16 + q[..., 1] * 4 + q[..., 2]).reshape(n, -1)
    hist = np.stack([np.bincount(c, minlength=64) for c in code]).astype(np.float32)
    hist /= hist.sum(axis=1, keepdims=True)
    return np.concatenate([thumb.reshape(n, -1), hist], axis=1)


def identity_distance(feats: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Distance (N,) of each frame's features to the reference's (1, D) or (D,)."""
    ref = ref.reshape(1, -1)
    t = 192
    rms = np.sqrt(((feats[:, :t] - ref[:, :t]) ** 2).mean(axis=1))
    hist = 0.5 * np.abs(feats[:, t:] - ref[:, t:]).sum(axis=1)
    return (rms + 0.5 * hist).astype(np.float32)


def frame_change(x: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
    """Mean absolute change (N,) from the previous frame, in 0..255 grey levels.

    The first frame of a video (prev None) gets NaN: it has no predecessor.
    """
    before = np.concatenate([prev[None] if prev is not None else x[:1], x[:-1]])
    d = np.abs(x - before).mean(axis=(1, 2, 3)) * 255.0
    if prev is None:
        d[0] = np.nan
    return d.astype(np.float32)


CORNER = (8, 16)  # rows x columns at the bottom-left of the frame


def corner_error(frames: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """Mean absolute error (grey levels) of uint8 `frames` (N, H, W, 3) against `target`,
    the same shape or one (H, W, 3) image: in the bottom-left `CORNER`, and elsewhere."""
    x = np.asarray(frames, np.float32)
    err = np.abs(x - np.asarray(target, np.float32)).mean(axis=-1)  # (N, H, W)
    rows, cols = CORNER
    corner = np.zeros(err.shape[1:], bool)
    corner[-rows:, :cols] = True
    return float(err[:, corner].mean()), float(err[:, ~corner].mean())


# ---------------------------------------------------------------------------
# Scores from per-frame series.


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a, b = a - a.mean(), b - b.mean()
    den = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 1e-12 else 0.0


def lip_sync(opening: np.ndarray, jaw: np.ndarray, max_lag: int = 2) -> tuple[float, int]:
    """Best Pearson correlation of measured opening vs ground-truth jaw, and its lag.

    lag > 0 means the video's mouth moves `lag` frames after the ground truth.
    """
    n = min(len(opening), len(jaw))
    best = (-2.0, 0)
    for lag in range(-max_lag, max_lag + 1):
        a = opening[max(0, lag) : n + min(0, lag)]
        b = jaw[max(0, -lag) : n - max(0, lag)]
        r = pearson(a, b) if len(a) > 2 else 0.0
        if r > best[0] or (r == best[0] and abs(lag) < abs(best[1])):
            best = (r, lag)
    return best


def identity_drift(
    distance: np.ndarray, fps: int = FPS, window_s: float = 60.0
) -> tuple[list[float], float]:
    """Mean identity distance per window (a minute by default) and the drift.

    Drift = mean distance of the last window minus the first (0 when stable).
    """
    per = max(1, int(window_s * fps))
    windows = [float(np.nanmean(distance[i : i + per])) for i in range(0, len(distance), per)]
    # A trailing fragment under half a window is too short to stand for a minute.
    if len(windows) > 1 and len(distance) % per and len(distance) % per < per // 2:
        windows = windows[:-1]
    return windows, (windows[-1] - windows[0]) if windows else 0.0


def seam_smoothness(
    change: np.ndarray, seams: list[int], radius: int = 3, period: int = 1
) -> tuple[float, float]:
    """How much bigger the change at chunk seams is than inside chunks.

    `change[t]` is the change from frame t-1 to t; seam s is the first frame of a
    new chunk. Returns (local, global): the mean over seams of change[s] divided by
    the mean change of the non-seam frames within `radius` (counted in periods), and the
    mean seam change over the mean non-seam change. 1.0 is seamless; larger means
    visible jumps.

    `period`: a video VAE that decodes r frames per latent changes more from one latent to
    the next than inside a latent, and chunk seams always fall on latent starts. With
    `period=r` a seam is compared only with frames of the same phase (other latent starts),
    so the VAE's own temporal stride is not counted as a seam.
    """
    n = len(change)
    seams = sorted(s for s in set(seams) if 0 < s < n)
    if not seams:
        return 1.0, 1.0
    is_seam = np.zeros(n, bool)
    is_seam[seams] = True
    valid = ~np.isnan(change)
    same_phase = np.isin(np.arange(n) % period, [s % period for s in seams])
    ratios = []
    for s in seams:
        ts = range(max(1, s - radius * period), min(n, s + radius * period + 1))
        near = [t for t in ts if (t - s) % period == 0 and not is_seam[t] and valid[t]]
        if near:
            ratios.append(change[s] / max(float(np.mean(change[near])), 1e-3))
    inside = change[~is_seam & valid & same_phase]
    if not len(inside):
        inside = change[~is_seam & valid]
    global_ratio = float(np.mean(change[seams]) / max(float(np.mean(inside)), 1e-3))
    return (float(np.mean(ratios)) if ratios else 1.0), global_ratio


@dataclass(frozen=True)
class IdleScore:
    """Motion during silences: `present` (not frozen) and `bounded` (not wild)."""

    motion: float  # RMS head displacement inside silences, fraction of frame width
    change: float  # mean frame change inside silences, grey levels
    speed: float  # 95th percentile head speed inside silences, frame widths per frame
    mouth: float  # mean opening in silence over mean opening in speech (0 = closed)
    present: bool
    bounded: bool


# Thresholds: the synthetic world's idle motion sits well inside both (see tests).
IDLE_MIN_CHANGE = 0.05  # grey levels: below this the video is frozen
IDLE_MIN_MOTION = 0.0005  # frame widths
IDLE_MAX_MOTION = 0.03  # frame widths (~4 px at 128)
IDLE_MAX_SPEED = 0.01  # frame widths per frame


def idle_motion(
    offsets: np.ndarray,
    change: np.ndarray,
    opening: np.ndarray,
    silences: list[tuple[int, int]],
    size: int = WORK,
    trim: int = 3,
) -> IdleScore:
    """Score the head motion inside silence segments [start, stop) of frames.

    `trim` frames at each end are skipped: the mouth is still closing there.
    """
    n = len(change)
    inside = np.zeros(n, bool)
    dev, speeds = [], []
    for a, b in silences:
        a, b = max(0, a + trim), min(n, b - trim)
        if b - a < 3:
            continue
        inside[a:b] = True
        seg = offsets[a:b] / size
        dev.append(seg - seg.mean(axis=0))
        speeds.append(np.linalg.norm(np.diff(seg, axis=0), axis=1))
    if not dev:
        return IdleScore(0.0, 0.0, 0.0, 0.0, present=False, bounded=True)
    d = np.concatenate(dev)
    motion = float(np.sqrt((d * d).sum(axis=1).mean()))
    speed = float(np.percentile(np.concatenate(speeds), 95))
    ch = float(np.nanmean(change[inside]))
    speech = opening[~inside]
    mouth = (
        float(np.mean(opening[inside]) / max(float(np.mean(speech)), 1e-6)) if len(speech) else 0.0
    )
    present = ch >= IDLE_MIN_CHANGE and motion >= IDLE_MIN_MOTION
    bounded = motion <= IDLE_MAX_MOTION and speed <= IDLE_MAX_SPEED
    return IdleScore(motion, ch, speed, mouth, present, bounded)
