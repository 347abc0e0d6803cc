"""The reference as FlashHead expects it: a face-centred square, 512x512.

The authors' pipeline crops a square `face_ratio` face widths wide around the detected
face, its centre a little above the box's (55 % of the square above it, 45 % below),
clipped to the photo, resized to the model's size; then, like every input, scaled to cover
and centre-cropped. The face is found with the project's own finder
(`pipeline.photo.face.detect_faces`).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from pipeline.errors import PhotoError


def face_square(rgb: np.ndarray, face_ratio: float, size: int) -> np.ndarray:
    """uint8 (H, W, 3) photo → uint8 (size, size, 3) square around its largest face."""
    from pipeline.photo.face import detect_faces  # OpenCV: only where a photo is framed

    faces = detect_faces(rgb)
    if len(faces) == 0:
        raise PhotoError(
            "no face found in the photo: use a sharp, well-lit, frontal photo of one face",
            "face",
        )
    return crop_square(rgb, faces[0], face_ratio, size)


def crop_square(rgb: np.ndarray, box, face_ratio: float, size: int) -> np.ndarray:
    """The square around face box (x, y, w, h, photo pixels), resized to size x size."""
    h, w = rgb.shape[:2]
    x, y, bw, bh = (float(v) for v in box)
    cx, cy = x + bw / 2, y + bh / 2
    side = bw * face_ratio
    left, top = int(max(0, cx - 0.5 * side)), int(max(0, cy - 0.55 * side))
    right, bottom = int(min(w, cx + 0.5 * side)), int(min(h, cy + 0.45 * side))
    crop = Image.fromarray(rgb).crop((left, top, right, bottom)).resize((size, size))
    return cover_and_crop(np.asarray(crop), size, size)


def cover_and_crop(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """Scale (bilinear) to cover width x height, rounding up, and take the centre."""
    h, w = rgb.shape[:2]
    scale = max(height / h, width / w)
    nh, nw = int(np.ceil(scale * h)), int(np.ceil(scale * w))
    big = np.asarray(Image.fromarray(rgb).resize((nw, nh), resample=Image.Resampling.BILINEAR))
    top, left = int(round((nh - height) / 2.0)), int(round((nw - width) / 2.0))
    return np.ascontiguousarray(big[top : top + height, left : left + width])
