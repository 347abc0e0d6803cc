"""Batch mode: render a talking-avatar MP4 from a reference image and an audio file.

The file is streamed through a session exactly as live audio would be: decoded in blocks,
pushed, generated, and each frame written as soon as it is decoded. Memory does not depend
on the audio's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import av
from tqdm import tqdm

from pipeline.clock import FPS, MODEL_RATE
from pipeline.errors import MediaError
from pipeline.media import Mp4Writer, iter_audio, load_reference
from pipeline.stream import FrameBatch, Reference, StageTimes, StreamingEngine


@dataclass
class RenderResult:
    path: Path
    frames: int
    audio_seconds: float
    stage_seconds: dict[str, float]


def estimate_frames(audio_path: str | Path) -> int | None:
    try:
        with av.open(str(audio_path)) as c:
            return round(c.duration / av.time_base * FPS) if c.duration else None
    except (av.FFmpegError, OSError):
        return None


def render_file(
    engine: StreamingEngine,
    reference: str | Path | Reference,
    audio: str | Path,
    out: str | Path,
    seed: int = 0,
    progress: bool = True,
    face_box: tuple[float, ...] | None = None,
) -> RenderResult:
    """`reference`: a file, or what `facecast render` already prepared from it before the
    engine started. `face_box` (photo stack, real models): the face framed by hand, x, y, w, h
    (and an angle) in the photo's pixels."""
    if not isinstance(reference, str | Path):
        image: Reference = reference
    elif engine.cfg.family.photos:  # from the bytes: a synthetic PNG names its face
        from pipeline.photo.reference import load_prepared

        image = load_prepared(reference, engine.cfg, face_box)
    else:
        image = load_reference(reference, engine.cfg, face_box)
    v = engine.cfg.video
    session = engine.new_stream(image, seed=seed)  # finds the face: fails before any file
    writer = Mp4Writer(out, v.width, v.height, v.fps)
    bar = tqdm(
        total=estimate_frames(audio), unit="frame", disable=not progress, desc="render", leave=False
    )

    def write(batches: list[FrameBatch]) -> None:
        for b in batches:
            writer.write_frames(b.frames)
            bar.update(len(b.frames))

    try:
        model_samples = 0
        for block in iter_audio(audio):
            session.push_audio(block.model)
            writer.write_audio(block.output)
            model_samples += block.model.size
            write(session.generate_ready())
        if model_samples == 0:
            raise MediaError(f"audio {audio} is empty (no samples)")
        write(session.finish())
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
        session.close()
    times: StageTimes = getattr(session, "times", StageTimes())  # in-process streams keep them
    return RenderResult(Path(out), writer.frames, model_samples / MODEL_RATE, times.seconds)
