"""Live calls taking turns on an engine with a GPU's step times, on a CPU: their delays.

    python bench/turns_bench.py --json bench/results/turns_scripted_pro_fp8_h200_times.json

The engine is the tests' scripted one (`tests/support/realtime.py`: its steps sleep for the
times given, batched as FlashHead batches them), behind the real server, with real aiortc
clients (two, or `--calls N`) sending a tone or `--wav` speech at real time, each joining
`--gap` seconds after the one before. Each case runs as the server plans by default
(microphones' calls take turns, `realtime/stagger.py`) and with `--plan-sessions N` (every
call planned on the step of all, as the H200's ten-minute soak ran). Per call: frames sent,
fresh, skipped, dropped and repeated, the playout delay (a microphone's speech-to-lips, by
construction) as started and as grown, the pre-roll, the step its plan counted on and the
step it measured. The step times default to FlashHead Pro `fp8-fast` on the H200
(`bench/results/flashhead/bench_pro_fp8fast_same_run_as_authors_h200.json`). Lite's four
calls on its H200 times: `--calls 4 --chunk 24 --step 0.177 --batch2 0.279 --batch 3=0.30
--batch 4=0.34 --first 0.189 --piece-share 0`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

KEYS = ("frames_sent", "frames_fresh", "frames_missed", "ttff_ms", "playout_delay_ms",
        "playout_delay_now_ms", "preroll_ms", "planned_step_ms", "step_seconds",
        "frames_skipped", "frames_dropped", "frames_repeated")  # fmt: skip


async def calls_together(args: argparse.Namespace, gap: float, plan_sessions: int | None) -> list:
    """`args.calls` calls, each joining `gap` seconds after the one before; each call's stats
    once the last has run `args.seconds`."""
    from support.realtime import ScriptedBatchingEngine, running_server

    from facecast_client import FacecastClient
    from realtime.service import SERVICE

    engine = ScriptedBatchingEngine(
        batch_seconds(args), first_seconds=args.first, chunk=args.chunk,
        piece_share=args.piece_share, slowdown=args.served, transfer=args.transfer,
    )  # fmt: skip
    server = {} if plan_sessions is None else {"plan_sessions": plan_sessions}
    seconds = gap * (args.calls - 1) + args.seconds
    async with running_server(engine=engine, max_sessions=args.calls, **server) as (url, app):
        clients = []
        for i in range(args.calls):
            if i:
                await asyncio.sleep(gap)
            clients.append(FacecastClient(url, source(args, seconds + 5, i)))
            await clients[-1].connect()
        await asyncio.sleep(args.seconds)
        calls = []
        for client in clients:
            stats = app[SERVICE].sessions[client.session_id].stats()
            calls.append({k: stats.get(k) for k in KEYS})
        for client in clients:
            await client.close()
    return calls


def batch_seconds(args: argparse.Namespace) -> dict[int, float]:
    """A batch of n later steps' seconds: `--step`, `--batch2`, then each `--batch N=S`; a
    size not given takes the next smaller one's time plus a step's (no gain from batching)."""
    times = {1: args.step, 2: args.batch2}
    for spec in args.batch:
        n, _, s = spec.partition("=")
        times[int(n)] = float(s)
    for n in range(2, args.calls + 1):
        times.setdefault(n, times[n - 1] + args.step)
    return times


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
        plans = {"turns": None, "all": args.calls}
        for plan in [plans[name] for name in args.plans.split(",")]:
            calls = await calls_together(args, gap, plan)
            row = {"gap_s": gap, "plan_sessions": plan, "calls": calls}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step", type=float, default=0.524, help="a later step alone (s)")
    p.add_argument("--batch2", type=float, default=1.033, help="two later steps batched (s)")
    p.add_argument("--batch", action="append", default=[], metavar="N=S",
                   help="N later steps batched take S seconds (repeatable; --calls 3 or more)")  # fmt: skip
    p.add_argument("--first", type=float, default=0.478, help="a call's first step (s)")
    p.add_argument("--piece-share", type=float, default=0.66,
                   help="its first frames exist this share of a step in (0: at its end)")  # fmt: skip
    p.add_argument("--served", type=float, default=1.0,
                   help="served steps take this many times the times above, which the "
                   "warm-up reports (two Pro calls in the server's process on the H100: "
                   "1.05)")  # fmt: skip
    p.add_argument("--transfer", type=float, default=0.0,
                   help="seconds after its batch before a step's frames reach the call, "
                   "the engine free meanwhile (the engine process's pipe; 0.10 gives the "
                   "steps Lite's four calls measured on the H100; with --piece-share 0)")  # fmt: skip
    p.add_argument("--gap", type=float, action="append",
                   help="seconds between the calls' starts (repeatable; default 3 and 0)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=15.0, help="all calls together")
    p.add_argument("--calls", type=int, default=2, help="live calls, each --gap after the last")
    p.add_argument("--chunk", type=int, default=28, help="frames a step makes (Pro 28, Lite 24)")
    p.add_argument("--wav", type=Path, help="speech each call sends, looped (default: a tone)")
    p.add_argument("--json", type=Path)
    p.add_argument("--plans", default="turns,all", help="turns (the default plan), all "
                   "(--plan-sessions N), or both, comma-separated")  # fmt: skip
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log each call's placement, re-plans and growth (stderr)")  # fmt: skip
    args = p.parse_args()
    if args.verbose:
        logging.basicConfig(
            level=logging.WARNING, format="%(relativeCreated)8.0f %(name)s %(message)s"
        )
        logging.getLogger("realtime.playout").setLevel(logging.INFO)
        logging.getLogger("realtime.session").setLevel(logging.INFO)
        logging.getLogger("realtime.stagger").setLevel(logging.DEBUG)  # growth's options
    args.gap = args.gap or [3.0, 0.0]
    args.piece_share = args.piece_share or None
    rows = asyncio.run(run(args))
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "json"}
        text = json.dumps({"args": meta, "runs": rows}, indent=1, default=str)  # default: --wav
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
