"""Framing a reference photo for a model, shared by the families that frame one.

Every model takes its reference scaled to cover its video size and centre-cropped
(`cover_and_crop`; `cover_box` carries a box into that crop). A tilted face is turned
upright first (`upright`): the photo is rotated about the face's centre by the hand-drawn
box's angle, or by the found face's roll (its eye line, from the landmarks:
`found_face_box`), so the models see an upright face, as the faces they were trained on. A
tilt under `UPRIGHT_FROM_DEG` is a natural pose and is left alone.
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image

UPRIGHT_FROM_DEG = 5.0  # faces tilted at least this much are turned upright before cropping


def found_face_box(rgb: np.ndarray) -> tuple[float, ...] | None:
    """The largest face in the photo as a face box x, y, w, h, angle (degrees clockwise: its
    roll from the landmarks), or None where there is none."""
    from pipeline.faces.finder import find_faces  # LiteRT: only where a photo is framed

    faces = find_faces(rgb)
    if not faces:
        return None
    x, y, w, h = (float(v) for v in faces[0].box)
    return (x, y, w, h, float(np.degrees(faces[0].roll)))


def upright(rgb: np.ndarray, box) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The photo with the face of box x, y, w, h[, angle] (degrees clockwise) turned upright
    about the box's centre, and the box then (x, y, w, h: the same centre and size). A turn
    under `UPRIGHT_FROM_DEG` leaves the photo as it is. The canvas keeps the photo's size;
    what the turn brings in from past its edges repeats the edge pixels."""
    x, y, w, h = (float(v) for v in box[:4])
    angle = float(box[4]) if len(box) == 5 else 0.0
    if abs(angle) < UPRIGHT_FROM_DEG:
        return rgb, (x, y, w, h)
    centre = (x + w / 2, y + h / 2)
    # the face is turned `angle` clockwise on screen; OpenCV's positive angle turns the
    # image counter-clockwise (pixel centres at integers, as the box's coordinates are)
    turn = cv2.getRotationMatrix2D((centre[0] - 0.5, centre[1] - 0.5), angle, 1.0)
    size = (rgb.shape[1], rgb.shape[0])
    flags, border = cv2.INTER_LINEAR, cv2.BORDER_REPLICATE
    turned = cv2.warpAffine(np.ascontiguousarray(rgb), turn, size, flags=flags, borderMode=border)
    return turned, (x, y, w, h)


def cover_and_crop(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """Scale (bilinear) to cover width x height, rounding up, and take the centre."""
    (nw, nh), (left, top) = _cover(rgb.shape, width, height)
    big = np.asarray(Image.fromarray(rgb).resize((nw, nh), resample=Image.Resampling.BILINEAR))
    return np.ascontiguousarray(big[top : top + height, left : left + width])


def cover_box(shape: tuple[int, ...], box, width: int, height: int) -> np.ndarray:
    """Box x, y, w, h in a photo of `shape` → in the pixels of its `cover_and_crop`."""
    (nw, nh), (left, top) = _cover(shape, width, height)
    sx, sy = nw / shape[1], nh / shape[0]
    x, y, w, h = (float(v) for v in box[:4])
    return np.array([x * sx - left, y * sy - top, w * sx, h * sy])


def _cover(shape: tuple[int, ...], width: int, height: int) -> tuple[tuple[int, int], ...]:
    """The size a photo of `shape` is scaled to to cover width x height, and the crop's
    left, top."""
    h, w = shape[:2]
    scale = max(height / h, width / w)
    nh, nw = int(np.ceil(scale * h)), int(np.ceil(scale * w))
    return (nw, nh), (int(round((nw - width) / 2.0)), int(round((nh - height) / 2.0)))
