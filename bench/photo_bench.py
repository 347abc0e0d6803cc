"""The photo stack's engine, step by step: how fast it makes frames on this machine.

    python bench/photo_bench.py --config photo --threads 1 --seconds 20 \
        --json bench/results/photo_cpu.json

starts the engine as `facecast serve` does (load, warm-up of every chunk shape), then
streams `--seconds` of held-out espeak-ng speech through one session in the schedule's
steps, timing each `generate_ready()` (motion model + warp + frame copy). It reports
frames per second of engine time, the step times (first, p50, p95, max) and what the
schedule makes of them: the first frame can leave once step 0's audio has arrived and
step 0 has run. `--wav` streams a speech file instead, where espeak-ng is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.clock import FPS, MODEL_SAMPLES_PER_FRAME, model_samples
from pipeline.media import ASSETS, read_audio
from pipeline.photo.reference import load_prepared
from pipeline.startup import EngineOptions, start_engine
from pipeline.train.evaluate import held_out_speech


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="photo")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--reference", default=str(ASSETS / "portraits" / "grace_hopper.jpg"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--wav", help="speech to stream (default: held-out espeak-ng speech)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    engine, report = start_engine(
        EngineOptions(config=args.config, device=args.device, threads=args.threads)
    )
    if args.wav:  # a machine without espeak-ng (the lent GPU) streams a WAV made elsewhere
        audio = read_audio(args.wav)[: model_samples(args.seconds)]
    else:
        audio = held_out_speech(args.seconds)
    # the product's path: a real photo through the face detector, a synthetic reference
    # with the geometry its PNG carries (no detector needed)
    session = engine.new_stream(load_prepared(args.reference, engine.cfg))
    times, frames, k = [], 0, 0
    while True:
        need = engine.stream_step(k).audio_frames * MODEL_SAMPLES_PER_FRAME
        if need > len(audio):
            break
        session.push_audio(audio[session.timeline.total : need])
        t = time.perf_counter()
        frames += sum(len(b.frames) for b in session.generate_ready())
        times.append(time.perf_counter() - t)
        k += 1
    session.close()
    step0 = engine.stream_step(0)
    t_arr = np.array(times)
    out = {
        "config": args.config,
        "video": f"{engine.cfg.video.width}x{engine.cfg.video.height}",
        "device": args.device,
        "threads": args.threads,
        "startup_seconds": round(report.seconds, 3),
        "frames": frames,
        "engine_fps": round(frames / t_arr.sum(), 1),
        "real_time_factor": round(frames / FPS / t_arr.sum(), 2),
        "step_frames": engine.stream_step(1).frames,
        "step_seconds": {
            "first": round(times[0], 4),
            "p50": round(float(np.median(t_arr[1:])), 4),
            "p95": round(float(np.percentile(t_arr[1:], 95)), 4),
            "max": round(float(t_arr[1:].max()), 4),
        },
        "first_frame_after_s": round(step0.audio_frames / FPS + times[0], 3),
        "stage_seconds": {k: round(v, 3) for k, v in session.times.seconds.items()},
        "command": "python bench/photo_bench.py " + " ".join(argv or sys.argv[1:]),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
