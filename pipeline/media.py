"""Media in and out with PyAV: images, streamed audio decoding, and the MP4 writer.

PNGs can carry short text (tEXt chunks: `write_png(..., text=)`, `png_text`), which the
synthetic world uses to say which identity a reference shows (`pipeline.synth.reference`).

Audio of any container, codec, rate and channel count is decoded block by block and
resampled with FFmpeg's resampler (never by slicing), so a file of any length is read in
constant memory. The writer encodes H.264 (yuv420p) + AAC at 25 fps into a temporary file
that is renamed only when everything was written: a failure never leaves a partial file
under the requested name.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from pipeline.clock import FPS, MODEL_RATE, OUTPUT_RATE
from pipeline.errors import MediaError

ASSETS = Path(__file__).resolve().parent / "assets"


def default_reference(cfg) -> Path:
    """The bundled identity of a config: a real public-domain portrait for the photo stack
    and the real models, a synthetic-world face for the project's diffusion stacks."""
    return ASSETS / cfg.family.default_reference


def load_reference(path: str | Path, cfg, face_box=None) -> np.ndarray:
    """A reference image for `cfg` → uint8 (H, W, 3) RGB. The photo stack checks it first
    (bytes, type, pixels: `pipeline.photo.face.load_photo`); the real models get it checked
    the same way and framed as they expect, a tilted face turned upright
    (`pipeline.faces.framing`): FlashHead's face-centred square
    (`pipeline.flashhead.framing`), LiveAvatar's cover-and-crop
    (`pipeline.liveavatar.framing`). `face_box` frames the face by hand (x, y, w, h[, angle]
    in the photo's pixels) instead of the face finder."""
    family = cfg.family
    if not family.face_box:
        return load_image(path)
    from pipeline.faces.face_box import check_face_box
    from pipeline.photo.face import load_photo

    if not Path(path).is_file():
        raise MediaError(f"reference image not found: {path}")
    rgb = load_photo(str(path), cfg.photo)
    if face_box is not None:  # the same checks as the photo stack's: one line, no engine
        check_face_box(face_box, rgb.shape)
    # the photo stack's is framed and measured by `pipeline.photo.reference`
    return family.frame_reference(rgb, cfg, face_box)


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


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_png(path: str | Path, rgb: np.ndarray, text: dict[str, str] | None = None) -> Path:
    """uint8 (H, W, 3) RGB → a PNG file (FFmpeg's encoder: the same image, the same bytes),
    with `text` as tEXt chunks (ASCII keys and values) right after the header."""
    img = np.ascontiguousarray(rgb, dtype=np.uint8)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {img.shape}")
    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height, codec.pix_fmt = img.shape[1], img.shape[0], "rgb24"
    packets = codec.encode(av.VideoFrame.from_ndarray(img, format="rgb24")) + codec.encode(None)
    data = b"".join(bytes(p) for p in packets)
    if text:
        header_end = len(_PNG_SIGNATURE) + 4 + 4 + 13 + 4  # IHDR: length, type, data, CRC
        chunks = b"".join(_png_chunk(b"tEXt", _text_body(k, v)) for k, v in text.items())
        data = data[:header_end] + chunks + data[header_end:]
    Path(path).write_bytes(data)
    return Path(path)


def _text_body(key: str, value: str) -> bytes:
    if not (0 < len(key) < 80 and key.isascii() and value.isascii() and "\0" not in key + value):
        raise ValueError(f"PNG text needs an ASCII key of 1-79 characters and ASCII text: {key!r}")
    return key.encode("ascii") + b"\0" + value.encode("ascii")


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body)
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png_text(data: bytes) -> dict[str, str]:
    """The tEXt chunks of PNG bytes as {key: text}; {} for anything else. Chunks that are
    cut off or fail their CRC are skipped, never trusted."""
    out: dict[str, str] = {}
    if not data.startswith(_PNG_SIGNATURE):
        return out
    at = len(_PNG_SIGNATURE)
    while at + 12 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, end = data[at + 4 : at + 8], at + 12 + length
        if end > len(data) or kind == b"IEND":
            break
        body = data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[end - 4 : end])
        if kind == b"tEXt" and b"\0" in body and zlib.crc32(kind + body) == crc:
            key, value = body.split(b"\0", 1)
            out[key.decode("latin-1")] = value.decode("latin-1")
        at = end
    return out


def read_audio(path: str | Path, rate: int = MODEL_RATE) -> np.ndarray:
    """Any audio file FFmpeg reads (any rate, any channels) → float32 mono at `rate`."""
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"audio file not found: {path}")
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError(f"{path} has no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            parts = []
            for frame in container.decode(audio=0):
                frame.pts = None  # the resampler keeps its own continuous clock
                parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
            parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    except av.FFmpegError as exc:
        raise MediaError(f"cannot read audio {path}: {exc}") from None
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


AUDIO_FIX = "give a speech recording FFmpeg reads (WAV, MP3, M4A, OGG, FLAC, …)"


def probe_audio(path: str | Path) -> None:
    """Check up front that an audio file holds sound FFmpeg can decode (its first second),
    so a bad file is one line naming the fix before any engine starts, not after."""
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"audio file not found: {path}")
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError(f"audio {path} has no audio stream: {AUDIO_FIX}")
            samples = 0
            for frame in container.decode(audio=0):
                samples += frame.samples
                if samples >= frame.sample_rate:
                    break
    except av.FFmpegError as exc:
        # FFmpeg's errors carry an errno that means nothing to a person: its text only
        reason = getattr(exc, "strerror", None) or str(exc)
        raise MediaError(f"cannot read audio {path} ({reason}): {AUDIO_FIX}") from None
    except (OSError, ValueError) as exc:
        raise MediaError(f"cannot read audio {path} ({exc}): {AUDIO_FIX}") from None
    if samples == 0:
        raise MediaError(f"audio {path} is empty (no samples): {AUDIO_FIX}")


def resample(samples: np.ndarray, rate_in: int, rate_out: int = MODEL_RATE) -> np.ndarray:
    """float32 mono from `rate_in` to `rate_out` (libswresample: output 0 is input 0)."""
    x = np.ascontiguousarray(np.asarray(samples, np.float32).reshape(1, -1))
    if rate_in == rate_out or x.size == 0:
        return x.reshape(-1).copy()
    frame = av.AudioFrame.from_ndarray(x, format="flt", layout="mono")
    frame.sample_rate = rate_in
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate_out)
    parts = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """float PCM (NaN, inf and clipping tolerated) → int16."""
    x = np.nan_to_num(np.asarray(samples, np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


def write_wav(path: str | Path, samples: np.ndarray, rate: int = MODEL_RATE) -> Path:
    """Mono or (n, channels) PCM, int16 or float in [-1, 1] → a 16-bit PCM WAV file."""
    pcm = np.asarray(samples)
    pcm = pcm if pcm.dtype == np.int16 else to_pcm16(pcm)
    channels = 1 if pcm.ndim == 1 else pcm.shape[1]
    with av.open(str(path), "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=rate)
        stream.layout = "mono" if channels == 1 else "stereo"
        if pcm.size:
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(pcm.reshape(1, -1)), format="s16", layout=stream.layout.name
            )
            frame.sample_rate = rate
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return Path(path)


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
        buffered = 0.0
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

    def __init__(self, path: str | Path, width: int, height: int, fps: int = FPS) -> None:
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
        self.frames = 0  # frames written
        self.next_index = 0  # the frame index (pts) the next frame takes by default
        self.samples = 0

    def write_frames(self, frames: np.ndarray, start: int | None = None) -> None:
        """Frames in order; `start` places the first at that frame index (a recording with
        frames lost on the way leaves the gaps). A frame at or before the last is skipped."""
        index = self.next_index if start is None else start
        for rgb in frames:
            if index >= self.next_index:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                frame.pts = index
                self.frames += 1
                self.next_index = index + 1
                self.container.mux(self.video.encode(frame))
            index += 1

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
