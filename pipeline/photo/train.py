"""Train the photo stack's audio→motion model on the synthetic world's ground truth.

    python -m pipeline.photo.train --out pipeline/assets/weights/photo

builds (or reuses) two espeak-ng speech caches (`pipeline.train.data.build_speech_cache`:
utterances in several languages and voices, with the ground-truth mouth of every frame),
then fits `MotionNet` on random windows cut exactly as the engine reads them (context,
chunk, lookahead), with random gains and a little noise so loudness does not matter. A few
minutes on two CPU cores. Writes `motion.safetensors` and `train_summary.json` (the command,
settings, losses, held-out Pearson r per parameter) next to it.

Legend: B batch, S samples, T frames, P params.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import load_config
from pipeline.module import save_checkpoint
from pipeline.photo.motion import MOUTH_PARAMS, MotionNet

_WEIGHTS = torch.tensor([3.0, 1.0, 1.0, 0.5])  # jaw is what people see first


def load_cache(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    data = np.load(path)
    audio = data["audio"].astype(np.float32) / 32767.0
    return audio, data["params"][:, : len(MOUTH_PARAMS)], data["clip_start"]


def sample_batch(audio, params, starts, net: MotionNet, batch: int, frames: int, rng):
    """Random windows inside clips: (B, S) audio and (B, T, 4) targets for its frames."""
    c = net.cfg
    span = c.context_frames + frames + c.lookahead_frames
    xs, ys = [], []
    lengths = np.diff(starts)
    for _ in range(batch):
        k = int(rng.choice(np.flatnonzero(lengths > frames + 1)))
        first = int(rng.integers(-c.context_frames, lengths[k] - frames))  # window's chunk start
        lo = first - c.context_frames
        win = np.zeros(span * MODEL_SAMPLES_PER_FRAME, np.float32)
        a, b = max(lo, 0), min(lo + span, lengths[k])
        clip = audio[starts[k] * MODEL_SAMPLES_PER_FRAME : starts[k + 1] * MODEL_SAMPLES_PER_FRAME]
        win[(a - lo) * MODEL_SAMPLES_PER_FRAME : (b - lo) * MODEL_SAMPLES_PER_FRAME] = clip[
            a * MODEL_SAMPLES_PER_FRAME : b * MODEL_SAMPLES_PER_FRAME
        ]
        gain = float(np.exp(rng.uniform(np.log(0.25), np.log(2.0))))
        noise = rng.normal(0, 10 ** rng.uniform(-4.5, -2.5), win.shape).astype(np.float32)
        xs.append(np.clip(win * gain + noise, -1, 1))
        tgt = np.zeros((frames, len(MOUTH_PARAMS)), np.float32)
        f0, f1 = max(first, 0), min(first + frames, lengths[k])
        tgt[f0 - first : f1 - first] = params[starts[k] + f0 : starts[k] + f1]
        ys.append(tgt)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


@torch.no_grad()
def held_out_r(net: MotionNet, audio, params, starts) -> dict[str, float]:
    """Pearson r per parameter, each clip run whole (what a stream of it would give)."""
    preds, gts = [], []
    look = net.cfg.lookahead_frames
    for k in range(len(starts) - 1):
        clip = audio[starts[k] * MODEL_SAMPLES_PER_FRAME : starts[k + 1] * MODEL_SAMPLES_PER_FRAME]
        clip = np.pad(clip, (0, look * MODEL_SAMPLES_PER_FRAME))
        out = net(torch.from_numpy(clip)[None])[0, look:].numpy()
        preds.append(out[: starts[k + 1] - starts[k]])
        gts.append(params[starts[k] : starts[k + 1]])
    p, g = np.concatenate(preds), np.concatenate(gts)
    return {name: float(np.corrcoef(p[:, i], g[:, i])[0, 1]) for i, name in enumerate(MOUTH_PARAMS)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.photo.train", description=__doc__)
    ap.add_argument("--config", default="photo")
    ap.add_argument("--out", type=Path, default=Path("pipeline/assets/weights/photo"))
    ap.add_argument("--cache-dir", type=Path, default=Path("out/photo_train"))
    ap.add_argument("--clips", type=int, default=600, help="training clips (5-9 s each)")
    ap.add_argument("--val-clips", type=int, default=40)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--frames", type=int, default=48, help="frames per training window")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1601)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    from pipeline.train.data import build_speech_cache

    caches = {}
    for split, n, seed in (
        ("train", args.clips, args.seed),
        ("val", args.val_clips, args.seed + 1),
    ):
        path = args.cache_dir / f"speech_{split}_{n}_{seed}.npz"
        if not path.exists():
            print(f"synthesising {n} {split} clips with espeak-ng → {path}", flush=True)
            build_speech_cache(path, n, seed=seed, min_s=5.0, max_s=9.0, workers=args.threads)
        caches[split] = load_cache(path)
    cfg = load_config(args.config).photo
    torch.manual_seed(args.seed)
    net = MotionNet(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=args.steps)
    rng = np.random.default_rng(args.seed)
    losses = []
    bar = tqdm(range(args.steps), desc="motion", unit="step", mininterval=5)
    for _ in bar:
        x, y = sample_batch(*caches["train"], net, args.batch, args.frames, rng)
        pred = net.run_window(x, args.frames)
        loss = (((pred - y) ** 2).mean(dim=(0, 1)) * _WEIGHTS).sum() / _WEIGHTS.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss))
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", refresh=False)
    net.eval()
    r = held_out_r(net, *caches["val"])
    args.out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(net, args.out / "motion.safetensors")
    summary = {
        "command": "python -m pipeline.photo.train " + " ".join(argv or sys.argv[1:]),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "parameters": sum(p.numel() for p in net.parameters()),
        "receptive_frames": net.receptive_frames(),
        "train_frames": int(caches["train"][2][-1]),
        "loss_first_100": float(np.mean(losses[:100])),
        "loss_last_100": float(np.mean(losses[-100:])),
        "held_out_pearson_r": r,
        "seconds": round(time.time() - t0, 1),
        "torch_threads": args.threads,
    }
    (args.out / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
