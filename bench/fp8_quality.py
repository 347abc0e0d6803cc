"""What FP8 linears do to the demo avatar's quality: lip sync and identity against bf16/fp32.

The demo stack is small and fp32, so FP8 does not pay there in speed; what a user of
`--precision fp8` wants to know is what it costs in the metrics people see. This runs the
synthetic world's held-out evaluation (`pipeline.train.evaluate`: held-out people and
speech, ground-truth mouth track) for each precision on the same engine weights and prints
lip-sync r, identity drift and distance, and the PSNR of the FP8 frames against the default
ones. FP8 runs emulated where the device has no FP8 tensor cores (torch's reference e4m3
products, the same rounding, slowly): quality only, never a speed number.

    python bench/fp8_quality.py --config demo --identity 0 --identity 1 --seconds 8 \
        --json bench/results/fp8_quality_demo_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import load_config  # noqa: E402
from pipeline.diffusion.engine import Engine  # noqa: E402
from pipeline.precision import apply_fp8  # noqa: E402
from pipeline.synth.dataset import identity_for  # noqa: E402
from pipeline.synth.face import render_frames, render_reference  # noqa: E402
from pipeline.synth.motion import motion_from_audio  # noqa: E402
from pipeline.train.evaluate import EVAL_SEED, generate, held_out_speech, score  # noqa: E402


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Over all frames at once (the gate's `psnr_per_frame` judges each frame)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def evaluate(engine: Engine, identity: int, seconds: float) -> tuple[dict, np.ndarray]:
    person = identity_for(EVAL_SEED, identity)
    reference = render_reference(person, engine.cfg.video.width)
    audio = held_out_speech(seconds)
    frames, seams, *_ = generate(engine, reference, audio)
    truth = render_frames(person, motion_from_audio(audio, seed=EVAL_SEED), engine.cfg.video.width)
    return score(
        frames, reference, audio, seams, truth, engine.cfg.diffusion.vae.temporal_ratio
    ), frames


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--identity", type=int, action="append", help="held-out person (repeatable)")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    # each engine built (and FP8 calibrated) once; a stream leaves its engine unchanged
    base_engine = Engine.load(cfg)
    fp8_engines = {}
    for precision, scaling in (("fp8", "static"), ("fp8-rowwise", "row")):
        fp8_engines[precision] = Engine.load(cfg)
        apply_fp8(fp8_engines[precision], scaling, emulate=not torch.cuda.is_available())
    rows = []
    for identity in args.identity or [0]:
        base, base_frames = evaluate(base_engine, identity, args.seconds)
        row = {"identity": identity, "default": base}
        for precision, engine in fp8_engines.items():
            result, frames = evaluate(engine, identity, args.seconds)
            n = min(len(frames), len(base_frames))
            result["psnr_vs_default_db"] = round(psnr(frames[:n], base_frames[:n]), 2)
            row[precision] = result
        rows.append(row)
        keys = ("lip_sync_r", "identity_drift", "psnr_vs_default_db")
        print(json.dumps({k: {m: row[k].get(m) for m in keys} if k != "identity" else row[k]
                          for k in row}), flush=True)  # fmt: skip
    report = {"config": args.config, "seconds": args.seconds, "identities": rows,
              "device": "cuda" if torch.cuda.is_available() else "cpu (FP8 emulated)",
              "command": "python bench/fp8_quality.py " + " ".join(argv or sys.argv[1:])}  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
