"""A face framed by hand: the face box X,Y,W,H[,ANGLE] and its rules, in one place.

Where the detector misses the face or picks the wrong one, the user gives its box in the
original photo's pixels, optionally turned by ANGLE degrees clockwise about its centre:
`--face-box` on the command line, `?face_box=` on POST /photos, `"face_box"` in an offer.
`parse_face_box` reads it and `check_face_box` checks where it lies in the photo, for
every family that takes one (the CLI, the HTTP routes, the page's payload all come here).
"""

from __future__ import annotations

import argparse

import numpy as np

from pipeline.errors import PhotoError
from pipeline.faces.finder import min_face_side
from pipeline.faces.landmarks import turn

MAX_ROLL_DEG = 45.0  # past this the warp's upright-trained proportions are guesses
_BOX_ASPECT = 2.0  # a face box is about square: neither side more than twice the other

# x, y, w, h in the original photo's pixels, and optionally the angle (degrees, clockwise
# on screen) the box is turned by about its centre
FaceBox = tuple[float, ...]

FACE_BOX_HELP = (
    "X,Y,W,H[,ANGLE]: the face's box in the original photo's pixels (left, top, width, "
    "height; forehead to chin, about square), turned ANGLE degrees clockwise about its centre "
    "for a tilted face; used instead of the face detector"
)


def parse_face_box(value: object) -> FaceBox:
    """A face box from "X,Y,W,H[,ANGLE]" (the CLI's flag, the upload's query) or a list of
    four or five numbers (an offer's JSON); a `PhotoError` ("box") if it is not four finite
    numbers (and an angle) with a positive width and height. Where it lies in the photo is
    `check_face_box`'s."""
    if isinstance(value, str):
        parts: list = value.replace(" ", "").split(",")
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = []
    numbers = []
    for part in parts:
        if isinstance(part, bool):
            break
        try:
            numbers.append(float(part))
        except (TypeError, ValueError):
            break
    if len(parts) not in (4, 5) or len(numbers) != len(parts) or not all(np.isfinite(numbers)):
        raise PhotoError(
            f"face box {_shown(value)} is not four numbers X,Y,W,H (the face's left, top, width "
            "and height in the photo's pixels, e.g. 120,80,200,200) and an optional ANGLE "
            "(degrees clockwise, e.g. 120,80,200,200,30)",
            "box",
        )
    if numbers[2] <= 0 or numbers[3] <= 0:
        raise PhotoError(f"face box {_shown(value)}: its width and height must be > 0", "box")
    if len(numbers) == 5 and abs(numbers[4]) > MAX_ROLL_DEG:
        raise PhotoError(
            f"face box {_shown(value)} is turned {numbers[4]:g} degrees; the photo stack "
            f"animates faces tilted up to {MAX_ROLL_DEG:g}: rotate the photo nearer upright first",
            "box",
        )
    return tuple(numbers)


def face_box_arg(text: str) -> FaceBox:
    """`--face-box X,Y,W,H[,ANGLE]` as an argparse type: a bad one is argparse's one-line
    error."""
    try:
        return parse_face_box(text)
    except PhotoError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def box_angle(box: FaceBox) -> float:
    """The box's turn in radians (0 for a box of four numbers)."""
    return float(np.radians(box[4])) if len(box) == 5 else 0.0


def box_corners(box: FaceBox) -> np.ndarray:
    """The (4, 2) corners of the box as drawn, turned about its centre."""
    x, y, w, h = box[:4]
    c = np.array([x + w / 2, y + h / 2])
    local = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) / 2
    return c + np.array([turn(p, box_angle(box)) for p in local])


def check_face_box(
    box: FaceBox, shape: tuple[int, ...], video: tuple[int, int] | None = None, min_px: int = 0
) -> np.ndarray:
    """The box x, y, w, h as an array, if it lies inside a photo of `shape`, is at least as
    big as the faces the detector looks for (and, given the `video` size, as the `min_px` a
    face needs there once the photo covers it), and is about square; else a `PhotoError`
    ("box")."""
    x, y, w, h = box[:4]
    H, W = shape[:2]
    corners = box_corners(box)
    if corners.min() < -0.5 or corners[:, 0].max() > W + 0.5 or corners[:, 1].max() > H + 0.5:
        raise PhotoError(
            f"face box {_fmt(box)} reaches outside the {W}x{H} photo: give it in the "
            "original photo's pixels, inside 0..width and 0..height",
            "box",
        )
    side = min_face_side(shape)
    if video is not None:  # the photo is scaled to cover the video: a face box scales with it
        side = max(side, min_px / max(video[0] / W, video[1] / H))
    if min(w, h) < side - 1e-6:
        raise PhotoError(
            f"face box {_fmt(box)} is {min(w, h):g} px; a face needs at least {np.ceil(side):.0f} "
            f"px of this {W}x{H} photo"
            + (f" to fill {min_px} px of the {video[0]}x{video[1]} video" if video else "")
            + ": crop the photo closer around the face (or draw the box forehead to chin)",
            "box",
        )
    if max(w, h) > _BOX_ASPECT * min(w, h):
        raise PhotoError(
            f"face box {_fmt(box)} is {w:.0f}x{h:.0f}: a face box is about square "
            "(forehead to chin, ear to ear)",
            "box",
        )
    return np.array([x, y, w, h], np.float64)


def _shown(value: object) -> str:
    text = repr(value)  # a request's value: kept short in the one-line answer
    return text if len(text) <= 60 else text[:57] + "..."


def _fmt(box: FaceBox) -> str:
    return ",".join(f"{v:g}" for v in box)
