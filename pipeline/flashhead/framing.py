"""The reference as FlashHead expects it: a face-centred square, 512x512.

The authors' pipeline crops a square `face_ratio` face widths wide around the detected
face, its centre a little above the box's (55 % of the square above it, 45 % below),
clipped to the photo, resized to the model's size; then, like every input, scaled to cover
and centre-cropped. The face is found with the project's own finder
(`pipeline.photo.face.find_faces`), or framed by hand (a face box X,Y,W,H[,ANGLE]).

A tilted face is turned upright first (`upright`): the photo is rotated about the face's
centre by the hand-drawn box's angle, or by the found face's roll (its eye line, from the
landmarks), so the square the model sees holds an upright face, as the faces it was trained
on. A tilt under `UPRIGHT_FROM_DEG` is a natural pose and is left alone: the crop is then
the authors' exactly. LiveAvatar's framing (`pipeline.liveavatar.framing`) turns the photo
the same way.
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image

from pipeline.errors import PhotoError

UPRIGHT_FROM_DEG = 5.0  # faces tilted at least this much are turned upright before cropping


def found_face_box(rgb: np.ndarray) -> tuple[float, ...] | None:
    """The largest face in the photo as a face box x, y, w, h, angle (degrees clockwise: its
    roll from the landmarks), or None where there is none."""
    from pipeline.photo.face import find_faces  # LiteRT: only where a photo is framed

    faces = find_faces(rgb)
    if not faces:
        return None
    x, y, w, h = (float(v) for v in faces[0].box)
    return (x, y, w, h, float(np.degrees(faces[0].roll)))


def face_square(rgb: np.ndarray, face_ratio: float, size: int) -> np.ndarray:
    """uint8 (H, W, 3) photo → uint8 (size, size, 3) square around its largest face, the
    face turned upright."""
    box = found_face_box(rgb)
    if box is None:
        raise PhotoError(
            "no face found in the photo: use a sharp, well-lit, frontal photo of one face, "
            "or frame the face by hand with --face-box X,Y,W,H[,ANGLE] (the photo's pixels)",
            "face",
        )
    return crop_square(rgb, box, face_ratio, size)


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


def crop_square(rgb: np.ndarray, box, face_ratio: float, size: int) -> np.ndarray:
    """The square around face box x, y, w, h[, angle] (photo pixels; `upright` first),
    resized to size x size."""
    rgb, upright_box = upright(rgb, box)
    left, top, right, bottom = _square(rgb.shape, upright_box, face_ratio)
    crop = Image.fromarray(rgb).crop((left, top, right, bottom)).resize((size, size))
    return cover_and_crop(np.asarray(crop), size, size)


def square_box(shape: tuple[int, ...], box, face_ratio: float, size: int) -> np.ndarray:
    """Face box x, y, w, h[, angle] of a photo of `shape` → the upright box x, y, w, h in
    the pixels of its `crop_square` (`upright` keeps the box's centre and size)."""
    x, y, w, h = (float(v) for v in box[:4])
    left, top, right, bottom = _square(shape, (x, y, w, h), face_ratio)
    sx, sy = size / (right - left), size / (bottom - top)
    return np.array([(x - left) * sx, (y - top) * sy, w * sx, h * sy])


def _square(shape: tuple[int, ...], box, face_ratio: float) -> tuple[int, int, int, int]:
    """The authors' square around an upright box x, y, w, h: `face_ratio` widths wide, 55 %
    of it above the box's centre, clipped to the photo (left, top, right, bottom)."""
    h, w = shape[:2]
    x, y, bw, bh = box
    cx, cy = x + bw / 2, y + bh / 2
    side = bw * face_ratio
    left, top = int(max(0, cx - 0.5 * side)), int(max(0, cy - 0.55 * side))
    right, bottom = int(min(w, cx + 0.5 * side)), int(min(h, cy + 0.45 * side))
    return left, top, right, bottom


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


def frame_for_model(rgb: np.ndarray, cfg, face_box=None) -> np.ndarray:
    """A checked photo as FlashHead takes it (`pipeline.families`' `frame`): the face-centred
    square, framed by `face_box` when given, or the photo as it is where the config says
    it is already framed."""
    fh = cfg.flashhead
    if face_box is not None:
        return crop_square(rgb, face_box, fh.face_ratio, cfg.video.width)
    if not fh.frame_reference:
        return rgb
    return face_square(rgb, fh.face_ratio, cfg.video.width)


def box_for_model(shape: tuple[int, ...], box, cfg) -> np.ndarray:
    """Where `box` (in the photo) lands in `frame_for_model`'s square."""
    return square_box(shape, box, cfg.flashhead.face_ratio, cfg.video.width)
