"""Entry function for the CLI: `facecast eval`."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import av
import numpy as np

from pipeline.clock import MODEL_RATE
from pipeline.config import config_names, load_config
from pipeline.errors import MediaError
from pipeline.eval.evaluate import run_eval
from pipeline.faces.face_box import FACE_BOX_HELP, FaceBox, check_face_box, parse_face_box
from pipeline.families import REAL_MODELS
from pipeline.media import load_image, probe_audio, read_audio
from pipeline.schedule import ChunkPlan
from pipeline.synth.motion import mouth_track_from_audio, silence_segments


def _seams(args: argparse.Namespace, n_frames: int) -> list[int]:
    if args.seams:
        return [int(s) for s in args.seams.split(",") if s.strip()]
    if args.chunk_frames:
        return list(range(args.chunk_frames, n_frames, args.chunk_frames))
    if args.model:
        cfg = load_config(args.model)
        return ChunkPlan(cfg.schedule).seams(cfg.frames_per_latent, n_frames)
    return []


def _seam_period(args: argparse.Namespace) -> int:
    if args.seam_period is not None:
        return args.seam_period
    return load_config(args.model).vae_temporal_stride if args.model else 1


def _framed_as_the_model_saw_it(
    model: str, photo: Path, box: FaceBox | None, video: Path, folder: Path
) -> tuple[Path, FaceBox | None]:
    """The reference `model` made `video` from, as a PNG in `folder`: the photo framed as
    its engine frames it at the video's size (around the hand-drawn box, if one was drawn;
    a tilted face turned upright), and that box in the framed image's pixels (None: the
    detector's on it)."""
    from pipeline.media import load_reference, write_png

    try:
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            width, height = stream.width, stream.height
    except (av.FFmpegError, IndexError, OSError) as exc:
        raise MediaError(f"cannot read video {video}: {exc}") from None
    cfg = load_config(model, {"video.width": width, "video.height": height})
    framed = folder / "reference.png"
    write_png(framed, load_reference(photo, cfg, box))
    if box is None:
        return framed, None
    shape = load_image(photo).shape
    inside = cfg.family.box_in_frame(shape, box, cfg)
    return framed, tuple(float(v) for v in inside)


def _photo_eval(args: argparse.Namespace) -> int:
    from pipeline.eval.photo import run_photo_eval, write_json
    from pipeline.media import iter_audio

    photo = args.photo
    box = None
    if args.face_box is not None:  # a bad box is one line, before the video is read
        box = parse_face_box(args.face_box)
        check_face_box(box, load_image(photo).shape)
    probe_audio(args.audio)
    audio = np.concatenate([b.model for b in iter_audio(args.audio)] or [np.zeros(0, np.float32)])
    with tempfile.TemporaryDirectory() as tmp:
        if args.model and load_config(args.model).family.frame is not None:
            # a real model sees the photo framed its own way (FlashHead a face-centred square,
            # LiveAvatar the photo cropped to the video; a tilted face turned upright): score
            # the video against that, not the photo stack's framing of it
            photo, box = _framed_as_the_model_saw_it(args.model, photo, box, args.video, Path(tmp))
        scores = run_photo_eval(
            args.video,
            photo,
            audio,
            window_s=args.window_s or 10.0,
            face_box=box,
            seams_for=lambda n: _seams(args, n),
            seam_period=_seam_period(args),
            by_hand=args.face_box is not None,
        )
    print(scores.summary())
    if args.json:
        write_json(scores, args.json)
    if args.strip:
        import cv2

        from pipeline.eval.photo import face_strip

        args.strip.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(
            str(args.strip), face_strip(args.video, photo, scores, face_box=box)[:, :, ::-1]
        )
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    """Score a generated video against the audio's ground-truth mouth."""
    p = argparse.ArgumentParser(
        prog="facecast eval",
        description="Quality metrics of a generated talking-face video against the synthetic "
        "world's ground truth: lip sync, identity drift, seam smoothness, idle motion.",
    )
    p.add_argument("--video", type=Path, required=True, help="generated video (MP4, ...)")
    p.add_argument("--audio", type=Path, required=True, help="the driving audio (WAV)")
    p.add_argument("--reference", type=Path, help="reference image (default: first frame)")
    p.add_argument(
        "--photo",
        type=Path,
        help="a real portrait the video animates: score it against the photo instead "
        "(SSIM outside the mouth box, mouth motion vs speech, face found, drift; "
        "pipeline/eval/photo.py); --window-s defaults to 10 then",
    )
    p.add_argument(
        "--face-box",
        help="--photo: the face framed by hand, as the video was rendered with it; "
        + FACE_BOX_HELP,
    )
    p.add_argument(
        "--model",
        choices=sorted({*REAL_MODELS, *config_names()}),
        help="the model (or project config) that made the video: its chunk seams and its "
        "VAE's frames per latent are scored (instead of --seams/--chunk-frames, --seam-period)",
    )
    p.add_argument("--seams", help="comma-separated first frames of new chunks")
    p.add_argument("--chunk-frames", type=int, help="seams every N frames (instead of --seams)")
    p.add_argument(
        "--seam-period",
        type=int,
        help="frames per latent of the model (demo: 2; default: --model's, else 1): seams are compared with frames of "
        "the same phase, so the VAE's own latent-to-latent change is not counted as a seam",
    )
    p.add_argument(
        "--window-s", type=float, help="identity window (s; default 60, 10 with --photo)"
    )
    p.add_argument("--json", type=Path, help="also write the scores as JSON here")
    p.add_argument(
        "--strip",
        type=Path,
        help="--photo: write an image strip (photo, then 8 frames' faces; .jpg or .png)",
    )
    args = p.parse_args(argv)
    if args.face_box is not None and not args.photo:
        raise MediaError("--face-box frames the --photo the video animates: give --photo too")
    if args.photo:
        return _photo_eval(args)
    args.window_s = args.window_s or 60.0

    samples = read_audio(args.audio, MODEL_RATE)
    gt = mouth_track_from_audio(samples)
    reference = load_image(args.reference) if args.reference else None
    scores = run_eval(
        args.video,
        gt,
        _seams(args, len(gt)),
        silence_segments(samples),
        reference,
        window_s=args.window_s,
        seam_period=_seam_period(args),
    )
    print(scores.summary())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(scores.to_json())
    return 0 if np.isfinite(scores.lip_sync) else 1
