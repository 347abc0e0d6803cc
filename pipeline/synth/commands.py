"""Entry functions for the CLI: `facecast make-reference`, `make-dataset`, `make-sample-speech`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.clock import MODEL_RATE
from pipeline.media import write_png, write_wav
from pipeline.synth.dataset import build_dataset
from pipeline.synth.face import random_identity, render_reference
from pipeline.synth.reference import identity_text
from pipeline.synth.speech import synthesize

# The bundled pipeline/assets/reference.png is this identity.
DEFAULT_REFERENCE_SEED = 13


def make_reference_main(argv: list[str] | None = None) -> int:
    """Render a synthetic identity's neutral frame to a PNG that names the identity (a
    tEXt chunk, `pipeline.synth.reference`), so the photo stack knows where its face is."""
    p = argparse.ArgumentParser(
        prog="facecast make-reference",
        description="Render a reference image of a synthetic identity (neutral pose). The PNG "
        "carries the identity's parameters, so every config animates it; keep the file as it "
        "is written (a re-encoded copy loses them).",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_REFERENCE_SEED, help="identity seed")
    p.add_argument("--size", type=int, default=256, help="image side in pixels")
    p.add_argument("--out", type=Path, default=Path("reference.png"), help="PNG to write")
    p.add_argument("--params", type=Path, help="also write the identity parameters as JSON")
    args = p.parse_args(argv)
    ident = random_identity(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_png(args.out, render_reference(ident, args.size), text=identity_text(ident))
    if args.params:
        args.params.write_text(json.dumps(ident.to_dict(), indent=1))
    print(f"wrote {args.out} ({args.size}x{args.size}, identity seed {args.seed})")
    return 0


def make_dataset_main(argv: list[str] | None = None) -> int:
    """Build training shards of the synthetic face world."""
    p = argparse.ArgumentParser(
        prog="facecast make-dataset",
        description="Render a deterministic synthetic talking-face dataset "
        "(frames + 16 kHz audio + per-frame ground truth) as npz shards.",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--clips", type=int, default=200, help="number of clips (6-14 s each)")
    p.add_argument("--size", type=int, default=128, help="frame side in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--identities", type=int, help="identity pool size (default: one per clip)")
    p.add_argument("--clips-per-shard", type=int, default=16)
    p.add_argument("--workers", type=int, default=1, help="parallel processes")
    args = p.parse_args(argv)
    m = build_dataset(
        args.out,
        args.clips,
        args.size,
        args.seed,
        n_identities=args.identities,
        clips_per_shard=args.clips_per_shard,
        workers=args.workers,
    )
    print(
        f"wrote {m['n_clips']} clips, {m['n_frames']} frames ({m['seconds'] / 60:.1f} min) "
        f"to {args.out} in {m['build_seconds']:.0f} s"
    )
    return 0


# The bundled pipeline/assets/sample_speech.wav: two sentences and a pause.
SAMPLE_SENTENCES = ("Hello, and welcome to Facecast.", "This face talks in time with my voice.")


def make_sample_speech_main(argv: list[str] | None = None) -> int:
    """Synthesise the sample speech file with espeak-ng (16 kHz mono WAV)."""
    p = argparse.ArgumentParser(
        prog="facecast make-sample-speech",
        description="Speak two sentences with a pause between them, via espeak-ng.",
    )
    p.add_argument("--out", type=Path, default=Path("sample_speech.wav"))
    p.add_argument("--voice", default="f3", help="espeak-ng variant (m1..m7, f1..f4, ...)")
    p.add_argument("--pause-s", type=float, default=0.8)
    args = p.parse_args(argv)
    lead = np.zeros(int(0.3 * MODEL_RATE), np.float32)
    pause = np.zeros(int(args.pause_s * MODEL_RATE), np.float32)
    first, second = (synthesize(t, "en", args.voice, 150, 50) for t in SAMPLE_SENTENCES)
    audio = np.concatenate([lead, first, pause, second, lead])
    audio = 0.8 * audio / (np.max(np.abs(audio)) + 1e-6)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_wav(args.out, audio)
    print(f"wrote {args.out} ({len(audio) / MODEL_RATE:.2f} s, 16 kHz mono)")
    return 0
