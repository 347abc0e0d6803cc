"""The server's identity image: loaded once at the engine's size (for the photo stack,
checked, framed and measured once), or a drawn placeholder where no weights are packaged."""

from __future__ import annotations

import av
import numpy as np

from pipeline.config import FacecastConfig
from pipeline.stream import Reference


def load_reference(
    path: str | None, cfg: FacecastConfig, face_box: tuple[float, ...] | None = None
) -> Reference:
    """The identity image as uint8 (H, W, 3) at the engine's size; for the photo stack the
    photo checked, framed (around `face_box`, its pixels, when given) and measured once
    (`PreparedPhoto`, video-sized), so sessions neither detect the face again nor carry a
    large photo to the engine process; for the real models the framing each expects (FlashHead's
    face-centred square, LiveAvatar's cover-and-crop), a tilted face turned upright."""
    from pipeline.media import default_reference
    from pipeline.media import load_reference as load

    width, height = cfg.video.width, cfg.video.height
    if path is None:
        packaged = default_reference(cfg)
        if not packaged.exists():
            return _placeholder_reference(width, height)
        path = str(packaged)
    if cfg.family.photos:
        from pipeline.photo.reference import load_prepared

        return load_prepared(path, cfg, face_box)
    rgb = load(path, cfg, face_box)
    if rgb.shape[:2] != (height, width):
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        rgb = frame.to_ndarray(width=width, height=height, format="rgb24")
    return rgb


def _placeholder_reference(width: int, height: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    face = (
        (x - width / 2) ** 2 / (0.3 * width) ** 2 + (y - height / 2) ** 2 / (0.4 * height) ** 2
    ) < 1
    img = np.full((height, width, 3), (70, 90, 120), np.uint8)
    img[face] = (224, 180, 150)
    return img
