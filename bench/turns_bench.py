"""Two live calls taking turns on an engine with a GPU's step times, on a CPU: their delays.

    python bench/turns_bench.py --json bench/results/turns_scripted_pro_fp8_h200_times.json

The engine is the tests' scripted one (`tests/support/realtime.py`: its steps sleep for the
times given, batched as FlashHead batches them), behind the real server, with two real
aiortc clients sending a tone at real time, the second joining `--gap` seconds after the
first. Each case runs as the server plans by default (microphones' calls take turns,
`realtime/stagger.py`) and with `--plan-sessions 2` (every call planned on the step of both,
as the H200's ten-minute soak ran). Per call: frames sent and fresh, the playout delay (a
microphone's speech-to-lips, by construction) as started and as grown, the pre-roll, and the
step its plan counted on. The step times default to FlashHead Pro `fp8-fast` on the H200
(`bench/results/flashhead/bench_pro_fp8fast_same_run_as_authors_h200.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

KEYS = ("frames_sent", "frames_fresh", "frames_missed", "ttff_ms", "playout_delay_ms",
        "playout_delay_now_ms", "preroll_ms", "planned_step_ms", "step_seconds",
        "frames_skipped", "frames_dropped", "frames_repeated")  # fmt: skip


async def two_calls(args: argparse.Namespace, gap: float, plan_sessions: int | None) -> list:
    from support.realtime import ScriptedBatchingEngine, running_server

    from facecast_client import FacecastClient
    from realtime.service import SERVICE

    engine = ScriptedBatchingEngine(
        {1: args.step, 2: args.batch2}, first_seconds=args.first, chunk=28,
        piece_share=args.piece_share,
    )  # fmt: skip
    server = {} if plan_sessions is None else {"plan_sessions": plan_sessions}
    seconds = gap + args.seconds
    async with running_server(engine=engine, max_sessions=2, **server) as (url, app):
        first = FacecastClient(url, source(args, seconds + 5, 0))
        await first.connect()
        await asyncio.sleep(gap)
        second = FacecastClient(url, source(args, seconds + 5, 1))
        await second.connect()
        await asyncio.sleep(args.seconds)
        calls = []
        for client in (first, second):
            stats = app[SERVICE].sessions[client.session_id].stats()
            calls.append({k: stats.get(k) for k in KEYS})
        for client in (first, second):
            await client.close()
    return calls


def source(args: argparse.Namespace, seconds: float, seed: int):
    """A call's microphone: `--wav` looped (speech with pauses, as serve_bench sends), else a
    tone whose loudness the frames show, which never pauses."""
    from support.realtime import loudness_track

    from facecast_client import PcmSource, read_pcm

    if args.wav is None:
        return PcmSource(loudness_track(seconds, seed))
    return PcmSource(read_pcm(args.wav), loop=True)


async def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    for gap in args.gap:
        for plan in (None, 2):
            calls = await two_calls(args, gap, plan)
            row = {"gap_s": gap, "plan_sessions": plan, "calls": calls}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step", type=float, default=0.524, help="a later step alone (s)")
    p.add_argument("--batch2", type=float, default=1.033, help="two later steps batched (s)")
    p.add_argument("--first", type=float, default=0.478, help="a call's first step (s)")
    p.add_argument("--piece-share", type=float, default=0.66,
                   help="a step's first frames exist this share of it in")  # fmt: skip
    p.add_argument("--gap", type=float, action="append",
                   help="seconds between the calls' starts (repeatable; default 3 and 0)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=15.0, help="both calls together")
    p.add_argument("--wav", type=Path, help="speech each call sends, looped (default: a tone)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.gap = args.gap or [3.0, 0.0]
    rows = asyncio.run(run(args))
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "json"}
        args.json.write_text(json.dumps({"args": meta, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
