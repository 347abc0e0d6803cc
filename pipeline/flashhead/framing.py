"""The reference as FlashHead expects it: a face-centred square, 512x512.

The authors' pipeline crops a square `face_ratio` face widths wide around the detected
face, its centre a little above the box's (55 % of the square above it, 45 % below),
clipped to the photo, resized to the model's size; then, like every input, scaled to cover
and centre-cropped. The face is found with the project's own finder
(`pipeline.faces.framing.found_face_box`), or framed by hand (a face box X,Y,W,H[,ANGLE]).

A tilted face is turned upright first (`pipeline.faces.framing.upright`, as LiveAvatar's
framing does): the square the model sees holds an upright face, as the faces it was
trained on. A tilt under `UPRIGHT_FROM_DEG` is a natural pose and is left alone: the crop
is then the authors' exactly.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from pipeline.errors import PhotoError
from pipeline.faces.framing import cover_and_crop, found_face_box, upright


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
