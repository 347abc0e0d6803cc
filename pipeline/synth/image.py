"""PNG in and out without extra dependencies: zlib to write, PyAV (FFmpeg) to read."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np


def write_png(path: str | Path, rgb: np.ndarray) -> None:
    """Write uint8 (H, W, 3) RGB as a PNG (deterministic bytes for the same image)."""
    img = np.ascontiguousarray(rgb, dtype=np.uint8)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {img.shape}")
    h, w, _ = img.shape
    # Filter type 0 (none) on every row.
    raw = np.concatenate([np.zeros((h, 1), np.uint8), img.reshape(h, w * 3)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
    data += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    Path(path).write_bytes(data)


def read_image(path: str | Path) -> np.ndarray:
    """Any image FFmpeg reads (PNG, JPEG, ...) as uint8 (H, W, 3) RGB."""
    import av

    if not Path(path).exists():
        raise FileNotFoundError(f"image {path} not found")
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            return frame.to_ndarray(format="rgb24")
    raise ValueError(f"{path} holds no image")
