"""The product path, measured: `facecast serve` with a WebRTC client on the same machine.

    python bench/serve_bench.py --config rt720 --compile --wav speech.wav --seconds 60 \
        --json bench/results/serve_rt720_h200.json --markdown bench/RESULTS.md

starts `facecast serve` (a subprocess, exactly as a user would), waits for `/healthz` to be
ready (start-up seconds), then holds one call per `--mode` in turn with the project's aiortc
client: `live` sends the WAV looped in real time, as a microphone would (speech with pauses),
for `--seconds`; `push` sends it once at `--push-speed` times real time, as an agent's TTS
would, and lingers 3 s. For each call it records the server's own counters (fresh, repeated
and dropped frames, time to first frame, speech-to-lips p50/p95, playout delay), the
generation real-time factor and GPU memory from `/metrics`, and the client's view (fps,
A/V offset, longest gap, round trip of the sound).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from facecast_client import FacecastClient, PcmSource, read_pcm, wait_until_ready
from facecast_client.call import call_stats
from pipeline.clock import OUTPUT_RATE

SECTION = "## Live serving (`bench/serve_bench.py`)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MEMORY_EVERY_S = 10.0  # how often a call reads the engine's GPU memory


def metric_values(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


async def one_call(
    url: str,
    pcm,
    mode: str,
    seconds: float,
    speed: float,
    delay: float = 0.0,
    progress: Callable[[dict], None] | None = None,
) -> tuple[dict, FacecastClient | None]:
    """One call as the server saw it, and its client, whose own measurements (`call_stats`)
    are read after every call held together has ended: reading them takes seconds of this
    loop for a long call, which would stall the other calls' clients meanwhile. Every
    MEMORY_EVERY_S it hands `progress` the server's counters so far, so that a run cut short
    keeps what the call had shown until then."""
    await asyncio.sleep(delay)  # calls held together start a little apart, as people do
    source = PcmSource(pcm, speed=speed if mode == "push" else 1.0, loop=mode == "live")
    length = seconds if mode == "live" else pcm.size / OUTPUT_RATE / speed + 3.0
    async with aiohttp.ClientSession() as http:
        before = metric_values(await (await http.get(f"{url}/metrics")).text())
        client = FacecastClient(url, source)
        try:
            await client.connect()
        except ConnectionError as e:  # the server full (503): a result, not a failed run
            await client.close()
            return {"mode": mode, "seconds": length, "speed": source.speed, "refused": str(e)}, None
        # the engine's GPU memory through the call, every MEMORY_EVERY_S: flat, or a leak
        allocated, readings = [], max(1, round(length / MEMORY_EVERY_S))
        started = time.monotonic()
        for _ in range(readings):
            await asyncio.sleep(length / readings)
            now = metric_values(await (await http.get(f"{url}/metrics")).text())
            if now.get("facecast_gpu_memory_allocated_bytes"):  # 0: a CPU, no reading
                allocated.append(now["facecast_gpu_memory_allocated_bytes"])
            if progress is not None:
                listed = (await (await http.get(f"{url}/sessions")).json())["sessions"]
                progress({
                    "mode": mode,
                    "elapsed_s": round(time.monotonic() - started, 1),
                    "server": next((s for s in listed if s["id"] == client.session_id), {}),
                    "gpu_memory_allocated_bytes": list(allocated),
                })  # fmt: skip
        sessions = (await (await http.get(f"{url}/sessions")).json())["sessions"]
        after = metric_values(await (await http.get(f"{url}/metrics")).text())
        await client.close()
    server: dict = next((s for s in sessions if s["id"] == client.session_id), {})

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    generated = delta("facecast_chunk_duration_seconds_sum")
    return {
        "mode": mode,
        "seconds": length,
        "speed": source.speed,
        "server": server,
        "generation_rtf": delta("facecast_chunk_generation_seconds_sum") / generated
        if generated
        else None,
        "gpu_memory_peak_bytes": after.get("facecast_gpu_memory_peak_bytes"),
        "gpu_memory_allocated_bytes": allocated,  # sampled through the call
    }, client


async def run(args: argparse.Namespace) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "facecast", "serve", "--config", args.config, "--port", str(port)]
    cmd += ["--device", args.device] + (["--compile"] if args.compile else []) + args.serve_arg
    return await measure(args, cmd, port, "bench/serve_bench.py")


async def measure(args: argparse.Namespace, cmd: list[str], port: int, script: str) -> dict:
    """Start the server `cmd` starts on `port`, make the calls `args` asks for, and report
    them with the exact command (`script` and its arguments). The JSON (`args.json`) is
    written after every set of calls made together, marked incomplete until the last: a run
    cut short (a device command's time limit) keeps every set it measured, and the set under
    way's counters at its calls' last samples (`in_progress`)."""
    url = f"http://127.0.0.1:{port}"
    res: dict = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "gpu": gpu_name(),
            "commit": os.environ.get("FACECAST_COMMIT") or git_commit(),
            "config": args.config,
            # the server compiles when told so here or through --serve-arg
            "compile": args.compile or "--compile" in args.serve_arg,
            "command": " ".join([f"python {script}", *sys.argv[1:]]),
        },
        "startup_seconds": None,
        "health": None,  # /healthz when ready: max_sessions, the engine's capacity
        "calls": [],
        "complete": False,
    }
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: ASYNC230 - once, before the run
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220 - Popen returns at once; the child runs beside the loop
    try:
        health = await wait_until_ready(url, args.startup_timeout, server)
        res.update(startup_seconds=health.get("startup_seconds"), health=health)
        pcm = read_pcm(args.wav)

        def note(i: int, sample: dict) -> None:
            calls = res["in_progress"]
            calls[i] = {**sample, "concurrent": len(calls), "call": i}
            write_json(args.json, res)

        for mode, n in map(mode_and_calls, args.mode):
            before = await engine_batches(url)
            # the set's calls so far, written as they come: a soak cut short by the
            # device's budget lost two calls' 8 minutes of fresh shares without them
            res["in_progress"] = [None] * n
            together = await asyncio.gather(
                *(
                    one_call(
                        url, pcm, mode, args.seconds, args.push_speed, i * args.stagger,
                        progress=functools.partial(note, i),
                    )
                    for i in range(n)
                )
            )  # fmt: skip
            del res["in_progress"]
            batching = batches_between(before, await engine_batches(url))
            for i, (call, client) in enumerate(together):
                if client is not None:
                    call["client"] = call_stats(client)
                    if not call["server"] and call["client"].get("server"):
                        # the server closed the call before /sessions was read: its last
                        # stats report to the client says the same counters
                        call["server"] = call["client"]["server"]
                        call["server_from"] = "the server's last stats report to the client"
                call.update(concurrent=n, call=i, engine_batching=batching)
                res["calls"].append(call)
                print(summary(args.config, call), flush=True)
            write_json(args.json, res)  # once a set: the file never holds part of one
    finally:
        server.terminate()
        server.wait(30)
    res["complete"] = True
    return res


def write_json(path: str | None, res: dict) -> None:
    """Write `res` whole: into a file beside `path`, then renamed over it, so that a reader
    (`gpu_flashhead.sh soak collect`) never copies a half-written file."""
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(res, indent=2))
        partial.replace(target)


async def engine_batches(url: str) -> tuple[int, int] | None:
    """(batches, steps in them) the server's engine ran so far (/healthz), or None."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as r:
        health = await r.json()
    if "batches" not in health:
        return None
    return health["batches"], health["batched_steps"]


def batches_between(before, after) -> dict | None:
    """The engine's batching over a set of calls: batches, steps, and the mean batch."""
    if before is None or after is None:
        return None
    batches, steps = after[0] - before[0], after[1] - before[1]
    return {"batches": batches, "steps": steps, "mean_batch": round(steps / max(1, batches), 2)}


def summary(config: str, call: dict) -> str:
    if "refused" in call:
        return f"{config} {call['mode']} (call {call.get('call', 0) + 1} of {call.get('concurrent', 1)}): {call['refused']}"
    s, c = call["server"], call["client"]
    gb = call["gpu_memory_peak_bytes"]
    return (
        f"{config} {call['mode']} (call {call.get('call', 0) + 1} of {call.get('concurrent', 1)}): fresh {s.get('fresh_share')} "
        f"({s.get('frames_fresh')}/{s.get('frames_sent')}, dropped {s.get('frames_dropped')}, "
        f"skipped {s.get('frames_skipped')}, deadlines missed {s.get('frames_missed')}), ttff {s.get('ttff_ms')} ms, "
        f"speech-to-lips p50/p95 {s.get('speech_to_lips_p50_ms')}/"
        f"{s.get('speech_to_lips_p95_ms')} ms, delay {s.get('playout_delay_ms')}→"
        f"{s.get('playout_delay_now_ms')} ms on a {s.get('planned_step_ms')}-ms step, gen RTF {call['generation_rtf'] or 0:.3f}, "
        f"client fps {c.get('fps')} A/V {c.get('av_offset_ms')} ms gap {c.get('max_gap_ms')} ms "
        f"round trip p50/p95 {c.get('round_trip_p50_ms')}/{c.get('round_trip_p95_ms')} ms, "
        f"GPU {gb / 1e9 if gb else 0:.2f} GB{allocated_label(call)}{batching_label(call)}"
    )


def batching_label(call: dict) -> str:
    """', steps in batches of 2.4 (120 in 50)' over the calls made together, or nothing."""
    b = call.get("engine_batching")
    return f", steps in batches of {b['mean_batch']} ({b['steps']} in {b['batches']})" if b else ""


def allocated_label(call: dict) -> str:
    """', allocated A → B GB' over the call (first and last reading), or nothing on a CPU."""
    held = call.get("gpu_memory_allocated_bytes") or []
    return f", allocated {held[0] / 1e9:.2f} → {held[-1] / 1e9:.2f} GB" if held else ""


def markdown(res: dict) -> str:
    m = res["meta"]
    lines = [
        f"### {m['config']} · compile={m['compile']} · {m['gpu']}",
        "",
        f"{m['date']} · commit `{m['commit']}` · start-up {res['startup_seconds']} s",
        f"`{m['command']}`",
        "",
        "| call | fresh share of deadlines (fresh/sent) | dropped · skipped · missed | time to first frame | "
        "speech-to-lips p50 / p95 | playout delay start → now, on a step of | generation RTF | "
        "client fps · A/V · max gap | round trip p50 / p95 | GPU peak, allocated first → last |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for call in res["calls"]:
        if "refused" in call:
            label = f"{call['mode']} ×{call['speed']:g}{together_label(call)}"
            lines.append(f"| {label} | {call['refused']} |" + " |" * 8)
            continue
        s, c = call["server"], call["client"]
        gb = call["gpu_memory_peak_bytes"]
        rtf = call["generation_rtf"]
        lines.append(
            f"| {call['mode']} ×{call['speed']:g}, {call['seconds']:.0f} s"
            f"{together_label(call)} | "
            f"{s.get('fresh_share')} ({s.get('frames_fresh')}/{s.get('frames_sent')}) | "
            f"{s.get('frames_dropped')} · {s.get('frames_skipped')} · {s.get('frames_missed')} | "
            f"{s.get('ttff_ms')} ms | "
            f"{s.get('speech_to_lips_p50_ms')} / {s.get('speech_to_lips_p95_ms')} ms | "
            f"{s.get('playout_delay_ms')} → {s.get('playout_delay_now_ms')} ms, "
            f"{s.get('planned_step_ms')} ms | "
            f"{'–' if rtf is None else f'{rtf:.3f}'} | "
            f"{c.get('fps')} · {c.get('av_offset_ms')} ms · {c.get('max_gap_ms')} ms | "
            f"{c.get('round_trip_p50_ms')} / {c.get('round_trip_p95_ms')} ms | "
            f"{f'{gb / 1e9:.1f} GB' if gb else '–'}{allocated_label(call)} |"
        )
    return "\n".join(lines) + "\n"


def mode_and_calls(spec: str) -> tuple[str, int]:
    mode, _, n = spec.partition("*")
    if mode not in ("live", "push") or not (n or "1").isdigit() or int(n or "1") < 1:
        raise SystemExit(f"--mode {spec}: expected live or push, optionally *N (N >= 1)")
    return mode, int(n or "1")


def together_label(call: dict) -> str:
    n = call.get("concurrent", 1)
    return "" if n == 1 else f", {call['call'] + 1} of {n}"


def gpu_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"CPU ({os.cpu_count()} cores)"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--wav", required=True, help="speech with pauses (looped for live calls)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of a live call")
    p.add_argument(
        "--mode",
        action="append",
        help="live or push, repeatable; live*2: two such calls at once (they start --stagger "
        "seconds apart)",
    )
    p.add_argument("--push-speed", type=float, default=5.0)
    p.add_argument("--stagger", type=float, default=0.7, help="seconds between their starts")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--serve-arg", action="append", default=[], help="extra serve flag")
    p.add_argument("--server-log", help="write the server's output here")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args()
    args.mode = args.mode or ["live"]
    for spec in args.mode:  # refused before any server starts
        mode_and_calls(spec)
    res = asyncio.run(run(args))
    write_json(args.json, res)
    if args.markdown:
        append_section(Path(args.markdown), markdown(res))
    return 0


def append_section(path: Path, block: str, section: str = SECTION) -> None:
    text = path.read_text() if path.exists() else "# Facecast benchmark results\n"
    if section not in text:
        text = text.rstrip("\n") + f"\n\n{section}\n"
    head, tail = text.split(section, 1)
    path.write_text(head + section + tail.rstrip("\n") + "\n\n" + block)


if __name__ == "__main__":
    sys.exit(main())
