"""Per-step wall times of consecutive sessions on one started engine (first-use costs).

    python bench/session_steps.py --config rt720-low-latency --compile --sessions 3

Starts the engine the way every command does (`pipeline.startup`), then runs sessions one
after another, pushing each step's audio and timing `generate_ready()`: a step slower in a
later session than in the warm-up points at a cost paid per session (a recompilation, a
new shape), which serve would pay inside a call.
"""

from __future__ import annotations

import argparse
import json
import time

from pipeline.bench import speech_like_audio, test_card
from pipeline.clock import FPS, MODEL_SAMPLES_PER_FRAME
from pipeline.startup import EngineOptions, start_engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="rt720")
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    engine, report = start_engine(
        EngineOptions(config=args.config, device=args.device, compile=args.compile)
    )
    print("startup", json.dumps(report.to_dict(), default=str)[:300], engine.step_seconds)
    cfg = engine.cfg
    audio = speech_like_audio(engine.stream_step(args.steps).audio_frames / FPS + 1)
    ref = test_card(cfg.video.height, cfg.video.width)
    for s in range(args.sessions):
        session = engine.new_stream(ref, seed=s)
        times = []
        for k in range(args.steps):
            end = engine.stream_step(k).audio_frames * MODEL_SAMPLES_PER_FRAME
            session.push_audio(audio[session.timeline.total : end])
            t = time.perf_counter()
            session.generate_ready()
            times.append(time.perf_counter() - t)
        session.close()
        print(f"session {s}:", " ".join(f"{x:.3f}" for x in times), flush=True)


if __name__ == "__main__":
    main()
