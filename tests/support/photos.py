"""Portraits shipped for tests and images a photo upload must refuse."""

from __future__ import annotations

import numpy as np

from pipeline.media import ASSETS

PORTRAIT = ASSETS / "portraits" / "grace_hopper.jpg"


def write_bad_photos(d):
    import cv2

    portrait = cv2.imread(str(PORTRAIT))
    yy, xx = np.mgrid[0:300, 0:400]
    wall = np.stack([yy * 0.5, xx * 0.4, 200 - yy * 0.3], -1).astype(np.uint8)
    data = PORTRAIT.read_bytes()
    small = cv2.resize(portrait, None, fx=0.35, fy=0.35)
    far = np.full((1000, 1000, 3), 128, np.uint8)
    far[400 : 400 + small.shape[0], 400 : 400 + small.shape[1]] = small
    cases = {
        "tiny face": (cv2.imencode(".png", far)[1].tobytes(), "crop the photo closer"),
        "faceless": (cv2.imencode(".png", wall)[1].tobytes(), "no face found"),
        "two faces": (
            cv2.imencode(".jpg", np.concatenate([portrait, portrait], axis=1))[1].tobytes(),
            "shows 2 faces",
        ),
        "truncated": (data[: len(data) // 2], "truncated"),
        "corrupt": (data[:600] + bytes(range(256)) * 80 + b"\xff\xd9", "corrupt"),
        "not an image": (b"hello, I am text\n" * 10, "not a PNG, JPEG or WebP"),
        "too many pixels": (
            cv2.imencode(".png", np.zeros((6000, 8000, 3), np.uint8))[1].tobytes(),
            "megapixels",
        ),
        "too many bytes": (data[:3] + bytes(17 * 2**20), "MiB"),
    }
    out = {}
    for i, (name, (blob, message)) in enumerate(cases.items()):
        path = d / f"case{i}.img"  # a name that cannot hold the expected message
        path.write_bytes(blob)
        out[name] = (path, message)
    return out
