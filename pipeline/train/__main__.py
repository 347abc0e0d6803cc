"""`python -m pipeline.train`: train a config's stack on the synthetic face world.

    # once, where espeak-ng is installed: the speech the faces say
    python -m pipeline.train --make-speech .train_cache/speech.npz --clips 200
    # everything, resumable (rerun the same command with --resume after an interruption)
    python -m pipeline.train --config demo --speech .train_cache/speech.npz --out out/train
    # one stage, a quick look: --stage vae --steps 200

Weights land in `<out>/weights/`; point `runtime.weights` at that folder to use them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from pipeline.clock import FPS
from pipeline.config import load_config
from pipeline.train.run import STAGES, TrainConfig, check_grid, train_all


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.train", description=__doc__.splitlines()[0]
    )
    p.add_argument("--config", default="demo", help="config name or YAML path")
    p.add_argument("--out", default="out/train", help="weights, losses.jsonl, summary")
    p.add_argument("--state-dir", default=None, help="resumable state (default <out>/state)")
    p.add_argument("--speech", default=".train_cache/speech.npz", help="speech cache (.npz)")
    p.add_argument("--stage", default="all", choices=("all", *STAGES))
    p.add_argument("--resume", action="store_true", help="continue from saved state")
    p.add_argument("--steps", type=int, default=None, help="steps for every stage trained")
    p.add_argument("--batch", type=int, default=None, help="batch for every stage trained")
    for stage in STAGES:
        p.add_argument(f"--{stage}-seconds", type=float, default=None, help="wall-time cap")
        p.add_argument(f"--{stage}-steps", type=int, default=None)
        p.add_argument(f"--{stage}-batch", type=int, default=None)
        p.add_argument(f"--{stage}-lr", type=float, default=None)
    p.add_argument("--segments", type=int, default=None, help="rendered training segments")
    p.add_argument("--segment-frames", type=int, default=None)
    p.add_argument("--data-seed", type=int, default=None, help="which segments are rendered")
    p.add_argument("--workers", type=int, default=None, help="rendering processes")
    p.add_argument("--sr-input-noise", type=float, default=None, help="noise on SR's input")
    p.add_argument(
        "--decoder-contrast-weight", type=float, default=None, help="log-light L1 weight"
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--make-speech", default=None, help="write a speech cache here and exit")
    p.add_argument("--clips", type=int, default=200, help="clips in a new speech cache")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.make_speech:
        from pipeline.train.data import build_speech_cache

        cache = build_speech_cache(args.make_speech, args.clips)
        print(f"wrote {args.make_speech}: {len(cache.params)} clips, {cache.frames / FPS:.0f} s")
        return 0

    import torch

    cfg = load_config(args.config)
    check_grid(cfg)
    tc = TrainConfig()
    for key in (
        "segments",
        "segment_frames",
        "data_seed",
        "sr_input_noise",
        "decoder_contrast_weight",
    ):
        if getattr(args, key) is not None:
            setattr(tc, key, getattr(args, key))
    for stage in STAGES:
        s = getattr(tc, stage)
        steps = getattr(args, f"{stage}_steps") or args.steps
        secs = getattr(args, f"{stage}_seconds")
        batch = getattr(args, f"{stage}_batch") or args.batch or s.batch
        lr = getattr(args, f"{stage}_lr") or s.lr
        s = replace(s, steps=steps or s.steps, batch=batch, lr=lr)
        if secs is not None:
            s = replace(s, seconds=secs)
        if s.steps < 1000:  # short runs (smoke tests): log and save often enough to see
            s = replace(
                s, warmup=min(s.warmup, max(1, s.steps // 5)), log_every=max(1, s.steps // 5)
            )
        setattr(tc, stage, s)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    state_dir = Path(args.state_dir) if args.state_dir else out / "state"
    stages = STAGES if args.stage == "all" else (args.stage,)
    summary = train_all(
        cfg, tc, Path(args.speech), out, state_dir, stages, args.resume, device, args.workers
    )
    print(json.dumps({k: v for k, v in summary.items() if k != "train"}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
