"""Procedural 2.5D face renderer: identities in, uint8 frames out.

The face is a stack of soft-edged signed-distance shapes painted back to front in
numpy, vectorised over a batch of frames. Geometry lives in normalised frame
coordinates: x, y in [-1, 1], y pointing down, so one layout serves every size.

Head motion is a rigid transform (translation + roll) of the head's local frame,
plus a small yaw/pitch shift of the inner features relative to the face outline
(the 2.5D part: the features sit on a sphere that turns a little). The body and the
background do not move.

Shape legend: N frames, H x W pixels; `u_NHW`, `v_NHW` are head-local coordinates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.synth.motion import MotionTrack

# Hair styles, by index into FaceIdentity.hair_style.
HAIR_STYLES = ("short", "long", "bob", "curly", "buzz", "bun")

_SKIN_TONES = np.array(
    [
        [0.97, 0.86, 0.77],
        [0.94, 0.77, 0.64],
        [0.86, 0.65, 0.50],
        [0.76, 0.54, 0.39],
        [0.62, 0.42, 0.29],
        [0.47, 0.31, 0.21],
        [0.34, 0.22, 0.15],
    ],
    dtype=np.float32,
)
_HAIR_COLOURS = np.array(
    [
        [0.07, 0.06, 0.06],
        [0.20, 0.13, 0.08],
        [0.38, 0.24, 0.13],
        [0.55, 0.26, 0.12],
        [0.84, 0.69, 0.42],
        [0.68, 0.68, 0.68],
        [0.74, 0.37, 0.15],
        [0.20, 0.25, 0.55],
    ],
    dtype=np.float32,
)
# An open eye's half-height over its half-width (the sclera's ellipse).
_EYE_ASPECT = 0.55
_HAIR_WEIGHTS = np.array([0.22, 0.22, 0.16, 0.08, 0.12, 0.08, 0.08, 0.04])
_IRIS_COLOURS = np.array(
    [
        [0.30, 0.18, 0.09],
        [0.16, 0.10, 0.06],
        [0.45, 0.36, 0.16],
        [0.25, 0.45, 0.25],
        [0.25, 0.45, 0.70],
        [0.45, 0.50, 0.55],
    ],
    dtype=np.float32,
)


@dataclass(frozen=True)
class FaceIdentity:
    """Everything that makes one synthetic person look like themselves.

    Lengths are in normalised frame units (the frame spans 2.0), colours are RGB
    in [0, 1]. `random_identity(seed)` draws a plausible one.
    """

    face_width: float = 0.38  # half-width of the face outline
    face_height: float = 0.5  # half-height of the face outline
    jaw_taper: float = 0.25  # 0 = round face, 0.4 = pointed chin
    face_y: float = 0.0  # centre of the face outline
    skin: tuple[float, float, float] = (0.86, 0.65, 0.50)
    hair: tuple[float, float, float] = (0.20, 0.13, 0.08)
    hair_style: int = 0
    hair_volume: float = 0.5  # 0..1, how far hair stands off the head
    fringe: float = 0.4  # 0..1, how low the hairline comes over the forehead
    parting: float = 0.3  # -1..1, side of the parting
    eye_spacing: float = 0.14  # half-distance between eye centres
    eye_y: float = -0.07
    eye_size: float = 0.06  # half-width of an eye
    iris: tuple[float, float, float] = (0.30, 0.18, 0.09)
    brow_thickness: float = 0.022
    brow_angle: float = 0.1  # radians; positive raises the outer end
    nose_length: float = 0.13
    nose_width: float = 0.05
    mouth_y: float = 0.22  # centre of the mouth, below face_y
    mouth_width: float = 0.12  # half-width of the closed mouth
    lip_thickness: float = 0.028
    lips: tuple[float, float, float] = (0.72, 0.38, 0.36)
    teeth: tuple[float, float, float] = (0.95, 0.93, 0.86)
    background_top: tuple[float, float, float] = (0.55, 0.65, 0.80)
    background_bottom: tuple[float, float, float] = (0.25, 0.32, 0.48)
    shirt: tuple[float, float, float] = (0.20, 0.35, 0.55)
    glasses: bool = False
    light: float = 0.4  # -1..1, horizontal direction of the key light

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict) -> FaceIdentity:
        fields = {f.name for f in dataclasses.fields(FaceIdentity)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown FaceIdentity fields {unknown}; allowed: {sorted(fields)}")
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return FaceIdentity(**values)


def _rgb(x: np.ndarray) -> tuple[float, float, float]:
    c = np.clip(x, 0.0, 1.0)
    return (round(float(c[0]), 4), round(float(c[1]), 4), round(float(c[2]), 4))


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    k = (np.array([5.0, 3.0, 1.0]) + h * 6.0) % 6.0
    return v - v * s * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def random_identity(seed: int | np.random.Generator) -> FaceIdentity:
    """Draw a plausible, clearly individual identity, deterministic from `seed`."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    tone = rng.uniform(0, len(_SKIN_TONES) - 1)
    lo = int(tone)
    skin = _SKIN_TONES[lo] + (tone - lo) * (_SKIN_TONES[min(lo + 1, 6)] - _SKIN_TONES[lo])
    skin = skin * rng.uniform(0.96, 1.04, 3)
    hair = _HAIR_COLOURS[rng.choice(len(_HAIR_COLOURS), p=_HAIR_WEIGHTS)]
    hair = hair * rng.uniform(0.85, 1.15)
    lips = skin * np.array([0.86, 0.55, 0.55]) + np.array([0.08, 0.0, 0.02]) * rng.uniform(0.5, 1.5)
    # Backgrounds keep away from skin hues (orange) so a skin mask stays clean.
    hue = (rng.uniform(0.45, 1.02)) % 1.0
    bg_sat, bg_val = rng.uniform(0.15, 0.55), rng.uniform(0.55, 0.9)
    shirt_hue = rng.uniform(0.0, 1.0)
    face_width = rng.uniform(0.34, 0.42)
    return FaceIdentity(
        face_width=face_width,
        face_height=rng.uniform(0.46, 0.53),
        jaw_taper=rng.uniform(0.05, 0.4),
        face_y=rng.uniform(-0.03, 0.03),
        skin=_rgb(skin),
        hair=_rgb(hair),
        hair_style=int(rng.integers(len(HAIR_STYLES))),
        hair_volume=rng.uniform(0.2, 1.0),
        fringe=rng.uniform(0.0, 1.0),
        parting=rng.uniform(-1.0, 1.0),
        eye_spacing=face_width * rng.uniform(0.36, 0.44),
        eye_y=rng.uniform(-0.10, -0.04),
        eye_size=rng.uniform(0.05, 0.068),
        iris=_rgb(_IRIS_COLOURS[rng.integers(len(_IRIS_COLOURS))] * rng.uniform(0.85, 1.15)),
        brow_thickness=rng.uniform(0.014, 0.03),
        brow_angle=rng.uniform(-0.15, 0.3),
        nose_length=rng.uniform(0.10, 0.16),
        nose_width=rng.uniform(0.04, 0.06),
        mouth_y=rng.uniform(0.20, 0.25),
        mouth_width=rng.uniform(0.11, 0.145),
        lip_thickness=rng.uniform(0.02, 0.035),
        lips=_rgb(lips),
        teeth=_rgb(np.array([0.95, 0.93, 0.86]) * rng.uniform(0.93, 1.0)),
        background_top=_rgb(_hsv_to_rgb(hue, bg_sat, bg_val)),
        background_bottom=_rgb(_hsv_to_rgb(hue, bg_sat * 1.2, bg_val * 0.55)),
        shirt=_rgb(_hsv_to_rgb(shirt_hue, rng.uniform(0.2, 0.8), rng.uniform(0.25, 0.85))),
        glasses=bool(rng.random() < 0.2),
        light=rng.uniform(-0.8, 0.8),
    )


# ---------------------------------------------------------------------------
# Shapes: signed distances in normalised units (negative inside).


def _ellipse(x: np.ndarray, y: np.ndarray, a, b) -> np.ndarray:
    """Approximate signed distance to an axis-aligned ellipse with half-axes a, b.

    First-order (distance = f / |grad f|) form: exact on the boundary, which is all
    the anti-aliasing needs, and a handful of array ops.
    """
    xa, yb = x / a, y / b
    k0 = np.sqrt(xa * xa + yb * yb)
    k1 = np.sqrt(xa * xa / (a * a) + yb * yb / (b * b)) + 1e-6
    # The bounding box is a lower bound on the distance; it keeps very flat
    # ellipses (a closed mouth) from smearing along their major axis.
    box = np.maximum(np.abs(x) - a, np.abs(y) - b)
    return np.maximum(k0 * (k0 - 1.0) / k1, box)


def _circle(x: np.ndarray, y: np.ndarray, r) -> np.ndarray:
    return np.sqrt(x * x + y * y) - r


def _disc(cx, cy, r) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda u, v: _circle(u - cx, v - cy, r)


@dataclass
class _Canvas:
    """A batch of frames being painted, with each frame's head-local coordinates."""

    img: np.ndarray  # float32 (N, H, W, 3)
    u: np.ndarray  # float32 (N, H, W): head-local x
    v: np.ndarray  # float32 (N, H, W): head-local y
    px: float  # one pixel in normalised units
    reach: float  # how far the head moves in this batch, normalised units

    def roi(self, box: tuple[float, float, float, float]) -> tuple[slice, slice]:
        """Pixel window covering a head-local box (x0, y0, x1, y1) in every frame."""
        x0, y0, x1, y1 = box
        # Rotation by a small roll moves a box corner by at most |corner| * roll,
        # folded into `reach` together with the translation.
        size = self.img.shape[1]
        m = self.reach + 2 * self.px

        def to_px(c: float) -> int:
            return int(np.clip((c + 1.0) / self.px, 0, size))

        return slice(to_px(y0 - m), to_px(y1 + m) + 1), slice(to_px(x0 - m), to_px(x1 + m) + 1)

    def paint(
        self,
        shape: Callable[[np.ndarray, np.ndarray], np.ndarray],
        colour,
        box: tuple[float, float, float, float] | None = None,
        opacity: float | np.ndarray = 1.0,
        clip: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Composite `colour` where `shape(u, v) < 0`, with a one-pixel soft edge.

        `colour` is an RGB triple or a callable `(u, v) -> (..., 3)` for shading.
        Returns the coverage (N, h, w) inside the window, which later shapes in the
        same window may pass as `clip` to stay inside it (the iris inside the eye).
        """
        ys, xs = self.roi(box) if box is not None else (slice(None), slice(None))
        u, v = self.u[:, ys, xs], self.v[:, ys, xs]
        if u.size == 0:
            return None
        alpha = np.clip(0.5 - shape(u, v) / self.px, 0.0, 1.0)
        if isinstance(opacity, np.ndarray) and opacity.ndim == 1:
            opacity = opacity[:, None, None]
        alpha = alpha * opacity
        if clip is not None:
            alpha = np.minimum(alpha, clip)
        col = colour(u, v) if callable(colour) else np.asarray(colour, np.float32)
        region = self.img[:, ys, xs]
        region += alpha[..., None] * (col - region)
        return alpha


def _head_coords(
    size: int, motion: MotionTrack, start: int, stop: int, centre_y: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Head-local coordinates of every pixel for frames [start, stop)."""
    px = 2.0 / size
    g = (np.arange(size, dtype=np.float32) + 0.5) * px - 1.0
    tx = motion.head_x[start:stop, None, None].astype(np.float32)
    ty = motion.head_y[start:stop, None, None].astype(np.float32)
    roll = motion.head_roll[start:stop, None, None].astype(np.float32)
    # Rotate about the neck (below the face centre) so a roll reads as a head tilt.
    pivot = centre_y + 0.45
    x = g[None, None, :] - tx
    y = g[None, :, None] - ty - pivot
    c, s = np.cos(roll), np.sin(roll)
    u = c * x + s * y
    v = -s * x + c * y + pivot
    reach = float(
        np.max(np.abs(motion.head_x[start:stop]), initial=0)
        + np.max(np.abs(motion.head_y[start:stop]), initial=0)
        + 1.2 * np.max(np.abs(motion.head_roll[start:stop]), initial=0)
    )
    return u, v, reach


def render_frames(
    identity: FaceIdentity, motion: MotionTrack, size: int, batch: int = 16
) -> np.ndarray:
    """Render every frame of `motion` for `identity`: uint8 (N, size, size, 3), RGB.

    A pure function: the same inputs give the same bytes.
    """
    if size < 32:
        raise ValueError(f"size {size} is too small to draw a face; use 32 or more")
    n = len(motion)
    out = np.empty((n, size, size, 3), np.uint8)
    static = _static_layers(identity, size)
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        u, v, reach = _head_coords(size, motion, start, stop, identity.face_y)
        img = np.repeat(static[None], stop - start, axis=0)
        canvas = _Canvas(img, u, v, 2.0 / size, reach)
        _paint_head(canvas, identity, motion.slice(start, stop))
        np.multiply(img, 255.0, out=img)
        np.clip(img + 0.5, 0, 255, out=img)
        out[start:stop] = img.astype(np.uint8)
    return out


def render_reference(identity: FaceIdentity, size: int) -> np.ndarray:
    """The identity's neutral frame (mouth closed, eyes open, head still): (H, W, 3)."""
    return render_frames(identity, MotionTrack.neutral(1), size)[0]


Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class FaceLandmarks:
    """Where the neutral face lies in a `size` x `size` render, in continuous pixels
    (pixel i spans [i, i + 1), its centre is i + 0.5), x right and y down."""

    outline: Box  # the face outline's bounding box x, y, w, h, jaw closed
    eyes: tuple[Box, Box]  # each open eye's box x, y, w, h, image-left first
    mouth: tuple[float, float]  # centre of the closed mouth
    mouth_half_width: float  # the closed lips' half width (to the corners)


def landmarks(identity: FaceIdentity, size: int) -> FaceLandmarks:
    """The layout `render_reference(identity, size)` paints: the same quantities the
    painters below draw with, turned into pixels."""
    scale = size / 2.0  # normalised units (the frame spans 2.0) to pixels

    def to_px(c: float) -> float:
        return (c + 1.0) * scale

    fy, fw, fh = identity.face_y, identity.face_width, identity.face_height
    ey, ew = fy + identity.eye_y, identity.eye_size
    eh = ew * _EYE_ASPECT
    eyes = tuple(
        (to_px(s * identity.eye_spacing - ew), to_px(ey - eh), 2 * ew * scale, 2 * eh * scale)
        for s in (-1.0, 1.0)
    )
    return FaceLandmarks(
        outline=(to_px(-fw), to_px(fy - fh), 2 * fw * scale, 2 * fh * scale),
        eyes=(eyes[0], eyes[1]),
        mouth=(to_px(0.0), to_px(fy + identity.mouth_y)),
        mouth_half_width=identity.mouth_width * scale,
    )


# ---------------------------------------------------------------------------
# Layers.


def _static_layers(ident: FaceIdentity, size: int) -> np.ndarray:
    """Background, shoulders and the collar: everything that does not move."""
    px = 2.0 / size
    g = (np.arange(size, dtype=np.float32) + 0.5) * px - 1.0
    x, y = g[None, :], g[:, None]
    t = np.clip((y + 1.0) / 2.0, 0, 1)[..., None]
    top, bottom = np.array(ident.background_top), np.array(ident.background_bottom)
    img = (top + t * (bottom - top)).astype(np.float32)
    # A soft light pool behind the head gives the 2.5D backdrop some depth.
    glow = np.exp(-((x - 0.3 * ident.light) ** 2 + (y + 0.2) ** 2) / 0.5)[..., None]
    img = img * (0.85 + 0.25 * glow)
    img = np.broadcast_to(img, (size, size, 3)).astype(np.float32).copy()

    def paint(sd: np.ndarray, colour) -> None:
        alpha = np.clip(0.5 - sd / px, 0, 1)[..., None]
        img[:] += alpha * (np.asarray(colour, np.float32) - img)

    x2, y2 = np.broadcast_to(x, (size, size)), np.broadcast_to(y, (size, size))
    shirt = np.array(ident.shirt, np.float32)
    shade = (1.0 - 0.25 * np.clip(np.abs(x2) - 0.3, 0, 1))[..., None]
    shoulders = _ellipse(x2, y2 - 1.36, 1.0, 0.52)
    alpha = np.clip(0.5 - shoulders / px, 0, 1)[..., None]
    img += alpha * (shirt * shade - img)
    skin = np.array(ident.skin, np.float32)
    # Neckline: skin showing above the collar, under the neck that the head paints.
    paint(_ellipse(x2, y2 - 0.86, 0.18, 0.10), skin * 0.78)
    paint(np.maximum(np.abs(_ellipse(x2, y2 - 0.86, 0.2, 0.12)) - 0.012, -y2 + 0.82), shirt * 0.7)
    return img


def _paint_head(c: _Canvas, ident: FaceIdentity, m: MotionTrack) -> None:
    fy, fw, fh = ident.face_y, ident.face_width, ident.face_height
    skin = np.array(ident.skin, np.float32)
    hair = np.array(ident.hair, np.float32)
    style = HAIR_STYLES[ident.hair_style % len(HAIR_STYLES)]
    vol = 0.02 + 0.05 * ident.hair_volume

    # Hair behind the head (long styles fall onto the shoulders).
    if style in ("long", "bob"):
        drop = 0.62 if style == "long" else 0.22
        width = fw + vol + (0.02 if style == "long" else 0.05)

        def back_hair(u, v):
            top = _ellipse(u, v - fy, width, fh + vol)
            below = np.maximum(
                np.abs(u) - width * (1.0 - 0.15 * np.clip(v - fy, 0, 1)), v - fy - drop
            )
            return np.minimum(top, np.maximum(below, fy - v))

        c.paint(back_hair, lambda u, v: _strands(u, v, fy, hair * 0.8), (-1, -1, 1, 1))
    elif style == "curly":
        r = fw + 0.07 + 0.05 * ident.hair_volume

        def afro(u, v):
            ang = np.arctan2(v - fy + 0.08, u)
            return _ellipse(u, v - fy + 0.08, r, fh * 0.9 + 0.05) - 0.012 * np.sin(ang * 14.0)

        c.paint(afro, lambda u, v: _curls(u, v, hair), (-1, -1, 1, 1))
    elif style == "bun":
        c.paint(lambda u, v: _circle(u, v - (fy - fh - 0.06), 0.12), hair * 0.9, (-0.2, -1, 0.2, 0))

    # Neck, under the chin; its shadow sells the depth.
    neck_w = fw * 0.5
    c.paint(
        lambda u, v: np.maximum(np.abs(u) - neck_w, np.abs(v - (fy + fh + 0.1)) - 0.28),
        lambda u, v: skin * (0.72 + 0.1 * np.clip((v - fy - fh) * 4, 0, 1))[..., None],
        (-neck_w, fy + fh * 0.4, neck_w, 1.0),
    )

    # Ears.
    for side in (-1.0, 1.0):

        def ear(u: np.ndarray, v: np.ndarray, s: float = side) -> np.ndarray:
            return _ellipse(u - s * (fw + 0.005), v - (fy + 0.02), 0.045, 0.075)

        c.paint(
            ear,
            skin * 0.85,
            (side * fw - 0.06, fy - 0.06, side * fw + 0.06, fy + 0.1),
        )

    # The face outline: an egg whose lower half narrows, with the chin dropping a
    # little as the jaw opens.
    jaw = m.jaw[:, None, None].astype(np.float32)
    chin = fh + 0.035 * jaw

    def face(u, v):
        dv = v - fy
        lower = np.clip(dv / fh, 0, 1)
        half_w = fw * (1.0 - ident.jaw_taper * lower * lower)
        half_h = np.where(dv > 0, chin, fh)
        return _ellipse(u, dv, half_w, half_h)

    light = ident.light

    def face_colour(u, v):
        du, dv = u / fw, (v - fy) / fh
        r2 = du * du + dv * dv
        shade = 1.0 - 0.22 * r2 * r2 + 0.06 * light * du - 0.04 * dv
        # Cheek blush.
        blush = np.exp(-(((np.abs(u) - fw * 0.55) ** 2) + (v - fy - 0.1) ** 2) / 0.004)
        col = skin * shade[..., None]
        return col + blush[..., None] * (np.array([0.9, 0.45, 0.45]) * skin - col) * 0.25

    c.paint(face, face_colour, (-fw, fy - fh, fw, fy + fh + 0.05))

    # Inner features shift with yaw/pitch: they sit in front of the outline.
    fx_shift = (0.05 * m.yaw)[:, None, None].astype(np.float32)
    fy_shift = (0.04 * m.pitch)[:, None, None].astype(np.float32)
    fu = c.u - fx_shift
    fv = c.v - fy_shift
    feat = _Canvas(c.img, fu, fv, c.px, c.reach + 0.06)

    _paint_nose(feat, ident, skin)
    _paint_mouth(feat, ident, m, skin)
    _paint_eyes(feat, ident, m, skin)
    _paint_brows(feat, ident, m, hair)
    _paint_front_hair(c, ident, style, hair, vol)
    if ident.glasses:
        _paint_glasses(feat, ident)


def _strands(u, v, fy, colour):
    """Hair colour with a faint strand texture (stripes along the fall of the hair)."""
    ang = np.arctan2(u, (fy + 0.3) - v)
    tex = 0.9 + 0.1 * np.sin(ang * 40.0)
    return colour * tex[..., None]


def _curls(u, v, colour):
    tex = 0.85 + 0.15 * np.sin(u * 90.0) * np.sin(v * 90.0)
    return colour * tex[..., None]


def _paint_front_hair(c: _Canvas, ident: FaceIdentity, style: str, hair, vol: float) -> None:
    fy, fw, fh = ident.face_y, ident.face_width, ident.face_height
    top = fy - fh
    if style == "buzz":
        vol = 0.008
    # The hairline: a curve across the forehead, lower with more fringe, dipping
    # toward the parting side.
    line_y = top + fh * (0.32 + 0.35 * ident.fringe)
    part = ident.parting * fw * 0.5

    def cap(u, v):
        outer = _ellipse(u, v - fy, fw + vol, fh + vol)
        slope = 0.35 * ident.fringe * (u - part) * np.sign(ident.parting + 1e-3) / fw
        # Higher in the middle (forehead), lower at the temples, tilted by the parting.
        arch = 1.0 - np.clip((u / fw) ** 2, 0, 1)
        hairline = line_y - (0.03 + 0.1 * (1 - ident.fringe)) * arch + 0.05 * slope
        # Hair: above the hairline, or down the sides to temple level (sideburns).
        sides = np.maximum(fw * 0.86 - np.abs(u), v - (fy - 0.04))
        return np.maximum(outer, np.minimum(v - hairline, sides))

    opacity = 0.55 if style == "buzz" else 1.0
    colour = hair if style != "curly" else (lambda u, v: _curls(u, v, hair))
    if style not in ("buzz", "curly"):
        colour = lambda u, v: _strands(u, v, fy, hair)  # noqa: E731
    c.paint(cap, colour, (-fw - vol, top - vol, fw + vol, fy + 0.05), opacity=opacity)


def _paint_nose(c: _Canvas, ident: FaceIdentity, skin) -> None:
    fy = ident.face_y
    ny = fy + ident.nose_length
    nw = ident.nose_width
    side = 1.0 if ident.light < 0 else -1.0
    # A shadow down the unlit side of the bridge and under the tip.
    c.paint(
        lambda u, v: _ellipse(u - side * nw * 0.5, v - (ny - 0.05), 0.012, 0.06),
        skin * 0.82,
        (-nw, ny - 0.12, nw, ny + 0.02),
        opacity=0.6,
    )
    c.paint(
        lambda u, v: _ellipse(u, v - ny, nw, 0.028),
        skin * 0.88,
        (-nw, ny - 0.04, nw, ny + 0.04),
        opacity=0.8,
    )
    for s in (-1.0, 1.0):

        def nostril(u: np.ndarray, v: np.ndarray, s: float = s) -> np.ndarray:
            return _ellipse(u - s * nw * 0.45, v - ny - 0.008, 0.013, 0.008)

        c.paint(
            nostril,
            skin * 0.45,
            (-nw, ny - 0.02, nw, ny + 0.03),
        )


def _paint_mouth(c: _Canvas, ident: FaceIdentity, m: MotionTrack, skin) -> None:
    """Lips, the dark inner mouth, teeth and tongue, all from the mouth params."""
    my = ident.face_y + ident.mouth_y
    col = lambda a: a[:, None, None].astype(np.float32)  # noqa: E731
    jaw, width, rnd, teeth = col(m.jaw), col(m.width), col(m.rounding), col(m.teeth)
    half_w = ident.mouth_width * (1.0 + 0.22 * width - 0.38 * rnd)
    lip = ident.lip_thickness * (1.0 + 0.35 * rnd)
    gap = 0.15 * jaw + 0.035 * rnd * jaw  # lip-to-lip opening
    # The upper lip stays put; the lower lip follows the jaw.
    top = my - 0.1 * gap
    bottom = my + 0.9 * gap
    cy = 0.5 * (top + bottom)
    half_gap = 0.5 * gap
    box = (-0.2, my - 0.08, 0.2, my + 0.2)
    lips = np.array(ident.lips, np.float32)

    # Outer lips: one rounded shape, widest at the corners.
    def outer(u, v):
        return _ellipse(u, v - cy, half_w + 0.01, half_gap + lip)

    def lip_colour(u, v):
        # Upper lip darker, lower lip with a highlight.
        below = np.clip((v - cy) / (lip + 1e-3), -1, 1)
        shade = 0.86 + 0.14 * below - 0.12 * np.clip(below - 0.6, 0, 1) * 2
        return lips * shade[..., None]

    c.paint(outer, lip_colour, box)

    # The cavity between the lips: dark, tongue at the bottom, teeth at the top.
    def cavity(u, v):
        return _ellipse(u, v - cy, half_w * 0.86, half_gap + 1e-4)

    inside = c.paint(cavity, (0.09, 0.025, 0.03), box)
    if inside is None:
        return
    teeth_h = (0.4 * gap + 0.01) * teeth
    c.paint(
        lambda u, v: _ellipse(u, v - bottom, half_w * 0.55, 0.45 * half_gap + 0.004),
        lips * 0.5,
        box,
        clip=inside,
    )
    c.paint(
        lambda u, v: np.maximum(v - (top + teeth_h), np.abs(u) - half_w * 0.62),
        ident.teeth,
        box,
        clip=inside,
    )
    c.paint(
        lambda u, v: np.maximum((bottom - 0.25 * teeth_h) - v, np.abs(u) - half_w * 0.45),
        np.array(ident.teeth) * 0.9,
        box,
        opacity=0.8,
        clip=inside,
    )
    # The seam between closed lips, fading out as they part.
    seam = np.clip(1.0 - gap / 0.02, 0, 1)[..., 0, 0]
    c.paint(
        lambda u, v: np.maximum(
            np.abs(v - (my - 0.004 * (1 - (u / half_w) ** 2))) - 0.004, np.abs(u) - half_w * 0.92
        ),
        lips * 0.45,
        box,
        opacity=seam,
    )


def _paint_eyes(c: _Canvas, ident: FaceIdentity, m: MotionTrack, skin) -> None:
    ey = ident.face_y + ident.eye_y
    ew = ident.eye_size
    eh = ew * _EYE_ASPECT
    open_ = (1.0 - m.blink)[:, None, None].astype(np.float32)
    gx = (0.35 * ew * m.gaze_x)[:, None, None].astype(np.float32)
    gy = (0.2 * eh * m.gaze_y)[:, None, None].astype(np.float32)
    iris = np.array(ident.iris, np.float32)
    ir = eh * 0.95
    py = ey + gy  # pupil centre height
    for s in (-1.0, 1.0):
        ex = s * ident.eye_spacing
        box = (ex - ew - 0.03, ey - eh - 0.03, ex + ew + 0.03, ey + eh + 0.03)
        # Socket shadow and eyelid crease.

        def socket(u: np.ndarray, v: np.ndarray, ex: float = ex) -> np.ndarray:
            return _ellipse(u - ex, v - ey + 0.006, ew * 1.25, eh * 1.5)

        c.paint(
            socket,
            skin * 0.9,
            box,
        )
        h = eh * open_ + 1e-4
        # The lower lid stays; the upper lid comes down, so the eye's centre sinks.
        cy = ey + eh * (1.0 - open_) * 0.6

        def sclera(u, v, ex=ex, cy=cy, h=h):
            return _ellipse(u - ex, v - cy, ew, h)

        inside = c.paint(sclera, (0.96, 0.95, 0.93), box)
        # Iris, pupil and a catch-light, all inside the visible eye.
        px = ex + gx
        for dx, dy, r, colour in (
            (0.0, 0.0, ir, iris),
            (0.0, 0.0, ir * 0.45, (0.03, 0.03, 0.04)),
            (-0.35 * ir, -0.35 * ir, ir * 0.2, (1.0, 1.0, 1.0)),
        ):
            c.paint(_disc(px + dx, py + dy, r), colour, box, clip=inside)

        # Upper lid line (lashes), following the lid as it closes.
        def lid(u, v, ex=ex, cy=cy, h=h):
            ring = np.abs(_ellipse(u - ex, v - cy, ew, h)) - 0.008
            return np.maximum(ring, v - cy + 0.3 * h)

        c.paint(lid, (0.1, 0.1, 0.1), box, opacity=0.9)


def _paint_brows(c: _Canvas, ident: FaceIdentity, m: MotionTrack, hair) -> None:
    ey = ident.face_y + ident.eye_y
    raise_ = (0.025 * m.brow)[:, None, None].astype(np.float32)
    by = ey - ident.eye_size * 0.55 - 0.045
    bw = ident.eye_size * 1.15
    colour = hair * 0.75 + 0.05
    for s in (-1.0, 1.0):
        bx = s * ident.eye_spacing
        ang = s * ident.brow_angle

        def brow(u, v, s=s, bx=bx, ang=ang):
            x = u - bx
            y = v - by + raise_
            ca, sa = np.cos(ang), np.sin(ang)
            xr = ca * x + sa * y
            yr = -sa * x + ca * y + 1.4 * (xr * xr)  # arch
            # Thicker toward the nose, tapering outward.
            t = ident.brow_thickness * (1.0 - 0.35 * s * xr / bw)
            return _ellipse(xr, yr, bw, t)

        c.paint(brow, colour, (bx - bw - 0.02, by - 0.08, bx + bw + 0.02, by + 0.05))


def _paint_glasses(c: _Canvas, ident: FaceIdentity) -> None:
    ey = ident.face_y + ident.eye_y
    r = ident.eye_size * 1.45
    for s in (-1.0, 1.0):
        ex = s * ident.eye_spacing

        def rim(u: np.ndarray, v: np.ndarray, ex: float = ex) -> np.ndarray:
            return np.abs(_ellipse(u - ex, v - ey, r, r * 0.78)) - 0.008

        c.paint(
            rim,
            (0.1, 0.1, 0.12),
            (ex - r - 0.02, ey - r, ex + r + 0.02, ey + r),
        )
    gap = ident.eye_spacing - r
    c.paint(
        lambda u, v: np.maximum(np.abs(u) - gap, np.abs(v - ey + 0.01) - 0.006),
        (0.1, 0.1, 0.12),
        (-gap - 0.01, ey - 0.03, gap + 0.01, ey + 0.01),
    )
