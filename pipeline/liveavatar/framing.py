"""The reference as LiveAvatar takes it: the photo scaled to cover the video and
centre-cropped, as the authors' script does, with a tilted face first turned upright about
its centre (`pipeline.faces.framing.upright`: the hand-drawn box's angle, else the
found face's roll from its landmarks). A photo where no face is found is framed as before;
LiveAvatar's engine needs no face box.
"""

from __future__ import annotations

import numpy as np

from pipeline.faces.framing import cover_and_crop, cover_box, found_face_box, upright


def frame_reference(
    rgb: np.ndarray, width: int, height: int, face_box: tuple[float, ...] | None = None
) -> np.ndarray:
    """uint8 (H, W, 3) photo → uint8 (height, width, 3): turned upright about the face of
    `face_box` (x, y, w, h[, angle], photo pixels; default: the largest face found), then
    scaled to cover and centre-cropped."""
    box = face_box if face_box is not None else found_face_box(rgb)
    if box is not None:
        rgb, _ = upright(rgb, box)
    return cover_and_crop(rgb, width, height)


def framed_box(shape: tuple[int, ...], face_box, width: int, height: int) -> np.ndarray:
    """Face box x, y, w, h[, angle] of a photo of `shape` → the upright box x, y, w, h in
    the pixels of its `frame_reference` (the turn keeps the box's centre and size)."""
    return cover_box(shape, face_box[:4], width, height)


def frame_for_model(rgb: np.ndarray, cfg, face_box=None) -> np.ndarray:
    """A checked photo as LiveAvatar takes it (`pipeline.families`' `frame`)."""
    return frame_reference(rgb, cfg.video.width, cfg.video.height, face_box)


def box_for_model(shape: tuple[int, ...], box, cfg) -> np.ndarray:
    """Where `box` (in the photo) lands in `frame_for_model`'s frame."""
    return framed_box(shape, box, cfg.video.width, cfg.video.height)
