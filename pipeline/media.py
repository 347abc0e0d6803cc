"""Media in and out with PyAV: images, streamed audio decoding, and the MP4 writer.

Audio of any container, codec, rate and channel count is decoded block by block and
resampled with FFmpeg's resampler (never by slicing), so a file of any length is read in
constant memory. The writer encodes H.264 (yuv420p) + AAC at 25 fps into a temporary file
that is renamed only when everything was written: a failure never leaves a partial file
under the requested name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from pipeline.errors import MediaError

MODEL_RATE = 16_000
OUTPUT_RATE = 48_000
ASSETS = Path(__file__).resolve().parent / "assets"


def default_reference(cfg) -> Path:
    """The bundled identity of a config: a real public-domain portrait for the photo stack,
    a synthetic-world face for the diffusion stacks."""
    if cfg.runtime.stack == "photo":
        return ASSETS / "portraits" / "grace_hopper.jpg"
    return ASSETS / "reference.png"


def load_reference(path: str | Path, cfg) -> np.ndarray:
    """A reference image for `cfg` → uint8 (H, W, 3) RGB. The photo stack checks it first
    (bytes, type, pixels: `pipeline.photo.face.load_photo`)."""
    if cfg.runtime.stack == "photo":
        from pipeline.photo.face import load_photo

        if not Path(path).is_file():
            raise MediaError(f"reference image not found: {path}")
        return load_photo(str(path), cfg.photo)
    return load_image(path)


def load_image(path: str | Path) -> np.ndarray:
    """Any image FFmpeg reads (PNG, JPEG, WebP, …) → uint8 (H, W, 3) RGB."""
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"reference image not found: {path}")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"reference {path} holds no image")
            frame = next(container.decode(video=0))
            return frame.to_ndarray(format="rgb24")
    except MediaError:
        raise
    except (av.FFmpegError, StopIteration, ValueError, OSError) as exc:
        raise MediaError(f"cannot read reference image {path}: {exc}") from None


@dataclass
class AudioBlock:
    model: np.ndarray  # float32 mono at 16 kHz, for the engine
    output: np.ndarray  # float32 mono at 48 kHz, for the output file


def iter_audio(path: str | Path, block_seconds: float = 1.0) -> Iterator[AudioBlock]:
    """Decode an audio file in blocks of about `block_seconds`, resampled two ways."""
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"audio file not found: {path}")
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"cannot read audio {path}: {exc}") from None
    with container:
        if not container.streams.audio:
            raise MediaError(f"{path} has no audio stream")
        to_model = av.AudioResampler(format="flt", layout="mono", rate=MODEL_RATE)
        to_output = av.AudioResampler(format="flt", layout="mono", rate=OUTPUT_RATE)
        model_parts: list[np.ndarray] = []
        output_parts: list[np.ndarray] = []
        buffered = 0
        try:
            for frame in container.decode(audio=0):
                if frame.format.name in ("flt", "fltp", "dbl", "dblp"):
                    if not np.isfinite(frame.to_ndarray()).all():
                        raise MediaError(f"audio {path} contains NaN or infinite samples")
                frame.pts = None  # let the resamplers keep their own continuous clocks
                model_parts += [f.to_ndarray().reshape(-1) for f in to_model.resample(frame)]
                output_parts += [f.to_ndarray().reshape(-1) for f in to_output.resample(frame)]
                buffered += frame.samples / frame.sample_rate
                if buffered >= block_seconds:
                    yield _block(model_parts, output_parts)
                    model_parts, output_parts, buffered = [], [], 0.0
        except av.FFmpegError as exc:
            raise MediaError(f"audio {path} is corrupt: {exc}") from None
        model_parts += [f.to_ndarray().reshape(-1) for f in to_model.resample(None)]
        output_parts += [f.to_ndarray().reshape(-1) for f in to_output.resample(None)]
        if model_parts or output_parts:
            yield _block(model_parts, output_parts)


def _block(model_parts: list[np.ndarray], output_parts: list[np.ndarray]) -> AudioBlock:
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.float32)  # noqa: E731
    return AudioBlock(cat(model_parts).astype(np.float32), cat(output_parts).astype(np.float32))


class Mp4Writer:
    """H.264 + AAC MP4 at 25 fps, written to `<out>.partial` and renamed on `close()`."""

    def __init__(self, path: str | Path, width: int, height: int, fps: int = 25) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.partial")
        self.container = av.open(str(self.tmp), mode="w", format="mp4")
        self.video = self.container.add_stream("libx264", rate=fps)
        self.video.width, self.video.height = width, height
        self.video.pix_fmt = "yuv420p"
        self.video.options = {"crf": "20", "preset": "veryfast"}
        self.audio = self.container.add_stream("aac", rate=OUTPUT_RATE)
        self.audio.layout = "mono"
        self.frames = 0
        self.samples = 0

    def write_frames(self, frames: np.ndarray) -> None:
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = self.frames
            self.frames += 1
            self.container.mux(self.video.encode(frame))

    def write_audio(self, samples_48k: np.ndarray) -> None:
        if samples_48k.size == 0:
            return
        frame = av.AudioFrame.from_ndarray(
            samples_48k.reshape(1, -1).astype(np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = OUTPUT_RATE
        frame.pts = self.samples
        self.samples += samples_48k.size
        self.container.mux(self.audio.encode(frame))

    def close(self) -> None:
        """Flush the encoders and move the file into place."""
        self.container.mux(self.video.encode(None))
        self.container.mux(self.audio.encode(None))
        self.container.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Drop everything written so far; the requested path is left untouched."""
        try:
            self.container.close()
        except Exception:  # noqa: BLE001 - the file is deleted next either way
            pass
        self.tmp.unlink(missing_ok=True)
