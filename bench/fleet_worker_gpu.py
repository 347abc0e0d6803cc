"""The fleet worker on a GPU without Ray: `FleetWorker` driven directly, measured as
`bench/serve_bench.py` measures `facecast serve`.

    python bench/fleet_worker_gpu.py --config rt720 --compile --wav .gpu/speech.wav \
        --seconds 60 --mode live --mode push --json bench/results/fleet_worker_rt720_h200.json \
        --markdown bench/RESULTS.md

Ray cannot travel to the lent GPU machine (its wheel alone is larger than what may be sent
there), so this shows the GPU side of the fleet without it: a child process builds the
worker object exactly as the actor would (`realtime.fleet.actor.FleetWorker`, no
registry), starts its engine with `start()`, and puts a few HTTP routes in front of its
methods (the signalling the front relays through Ray: offer, sessions, delete, metrics,
health). The calls are then `serve_bench.one_call`'s, so the fresh share, time to first
frame and speech-to-lips compare one to one with serve_bench's rows for plain `serve`.

Not run yet: its numbers belong in bench/RESULTS.md once it has run on the H200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import (  # noqa: E402
    append_section,
    free_port,
    markdown,
    measure,
    write_json,
)

SECTION = "## The fleet worker on one GPU (`bench/fleet_worker_gpu.py`)"


def worker_app(worker) -> web.Application:
    """The worker's methods behind the routes serve_bench's client calls."""
    app = web.Application()

    async def offer(request: web.Request) -> web.Response:
        body = await request.json()
        answer = await worker.offer(body["sdp"], body.get("seed", 0), body.get("kvs_stream"))
        status = answer.get("status", 200)
        return web.json_response(answer, status=status)

    async def sessions(request: web.Request) -> web.Response:
        return web.json_response({"sessions": worker.describe_sessions()})

    async def delete(request: web.Request) -> web.Response:
        return web.json_response(await worker.close_session(request.match_info["id"]))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=await worker.metrics(), content_type="text/plain")

    async def healthz(request: web.Request) -> web.Response:
        status = worker.status()
        return web.json_response(status, status=200 if status["state"] == "ok" else 503)

    app.router.add_post("/offer", offer)
    app.router.add_get("/sessions", sessions)
    app.router.add_delete("/sessions/{id}", delete)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


async def serve_worker(args: argparse.Namespace) -> None:
    """The child: one FleetWorker, warm, behind `worker_app` until killed."""
    from pipeline.startup import EngineOptions
    from realtime.fleet.actor import FleetWorker
    from realtime.service import ServerConfig

    engine = EngineOptions(config=args.config, device=args.device, compile=args.compile)
    worker = FleetWorker("bench-worker", ServerConfig(max_sessions=1), engine)
    runner = web.AppRunner(worker_app(worker))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    status = await worker.start()
    print(f"worker {status['state']}: {json.dumps(status)}", flush=True)
    await asyncio.Event().wait()


async def run(args: argparse.Namespace) -> dict:
    port = free_port()
    cmd = [sys.executable, __file__, "--serve-worker", "--port", str(port)]
    cmd += ["--config", args.config, "--device", args.device]
    cmd += ["--compile"] if args.compile else []
    return await measure(args, cmd, port, "bench/fleet_worker_gpu.py")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="rt720")
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--wav", help="speech with pauses (looped for live calls)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of a live call")
    p.add_argument("--mode", action="append", choices=["live", "push"], help="repeatable")
    p.add_argument("--push-speed", type=float, default=5.0)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--server-log", help="write the worker's output here")
    p.add_argument("--json")
    p.add_argument("--markdown")
    p.add_argument("--serve-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.set_defaults(serve_arg=[], stagger=0.0)  # what serve_bench.measure reads besides
    args = p.parse_args()
    if args.serve_worker:
        asyncio.run(serve_worker(args))
        return 0
    if not args.wav:
        p.error("--wav is required")
    args.mode = args.mode or ["live"]
    res = asyncio.run(run(args))
    write_json(args.json, res)
    if args.markdown:
        append_section(Path(args.markdown), markdown(res), SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
