"""How soon an agent's speech is on screen, per path into `facecast serve`.

    python bench/agent_bench.py --config demo --device cpu --turns 4 \
        --json bench/results/agent_paths_cpu.json

starts `facecast serve` (a subprocess), then holds one call per path, each idle for a
moment (the avatar on screen) and then `--turns` turns of the same espeak-ng sentence:

  mic       the microphone track in real time (a person, or an agent on the media path)
  mic-x5    the microphone track, the whole call pushed at 5x from the start
  channel   the utterance channel on the data channel, each turn at `--speed` (5x)
  socket    the utterance channel on the WebSocket /sessions/{id}/speech, likewise

For each turn it measures "speech on screen": from the first sent sample of speech to the
arrival of the first returned audio with that speech (the avatar's audio leaves with the
video frame made from it, so this is also when the lips start to move). It also reports
time to first frame (connect to the first video frame), the server's speech-to-lips
p50/p95 (an audio sample's arrival to its frame leaving) and `playback_started` latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

from facecast_client import (
    FacecastClient,
    PcmSource,
    SpeechSocket,
    read_pcm,
    wait_until_ready,
)
from pipeline.clock import OUTPUT_RATE, OUTPUT_SAMPLES_PER_PACKET

TEXT = "Hello there, how can I help you today?"
LOUD = 1000
GAP_S = 4.0  # quiet between turns


def espeak(text: str) -> np.ndarray:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SystemExit("espeak-ng is needed (make sysdeps), or pass --wav")
    out = Path("/tmp/facecast-agent-bench.wav")
    subprocess.run([exe, "-w", str(out), text], check=True)
    pcm = read_pcm(out)
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return pcm[loud[0] : loud[-1] + 1]


def loud_arrivals(client: FacecastClient) -> list[tuple[int, float]]:
    """(timeline sample, arrival) of each returned 20 ms that carries speech."""
    rec = client.received
    base = rec.audio_pts[0] if rec.audio_pts else 0
    return [
        (pts - base, t)
        for pts, pcm, t in zip(rec.audio_pts, rec.audio, rec.audio_arrival, strict=True)
        if np.abs(pcm.astype(np.int32)).max() > LOUD
    ]


def first_after(arrivals: list[tuple[int, float]], t: float, at: int = 0) -> float | None:
    return next((a for pos, a in arrivals if a > t and pos >= at), None)


async def mic_call(url: str, speech: np.ndarray, turns: int, speed: float) -> dict:
    quiet = np.zeros(int(GAP_S * OUTPUT_RATE), np.int16)
    script = np.concatenate([quiet[: OUTPUT_RATE * 2]] + [np.concatenate([speech, quiet])] * turns)
    onsets = [2 * OUTPUT_RATE + k * (speech.size + quiet.size) for k in range(turns)]
    client = FacecastClient(url, PcmSource(script, speed=speed))
    await client.connect()
    await asyncio.sleep(script.size / OUTPUT_RATE + 3.0)  # the reply plays in real time
    on_screen = []
    arrivals = loud_arrivals(client)
    grown = [
        (e["at_ms"] * OUTPUT_RATE // 1000, e["added_ms"] * OUTPUT_RATE // 1000)
        for e in client.events
        if e["type"] == "delay_grown"
    ]
    for onset in onsets:
        sent = client.source.sent_at[onset // OUTPUT_SAMPLES_PER_PACKET]
        at = onset  # where the server's timeline has it: after the silence it inserted
        for where, added in grown:
            at += added if where <= at else 0
        got = first_after(arrivals, sent, at - OUTPUT_SAMPLES_PER_PACKET)
        on_screen.append(None if got is None else got - sent)
    return await finish(url, client, on_screen, [])


async def channel_call(url: str, speech: np.ndarray, turns: int, speed: float, socket: bool):
    client = FacecastClient(url, None)
    await client.connect()
    await client.wait_channel_open()
    await client.wait_frames(50, timeout=120)
    sock = None
    if socket:
        sock = SpeechSocket(url, client.session_id)
        await sock.connect()
    sender = sock or client
    on_screen, started = [], []
    for k in range(turns):
        sent = time.monotonic()
        await sender.speech.say(speech, OUTPUT_RATE, uid=f"turn{k}", speed=speed)
        start = await sender.wait_event("playback_started", 60, sent)
        await sender.wait_event("playback_finished", 60, sent)
        await asyncio.sleep(1.0)
        got = first_after(loud_arrivals(client), sent, start["at_sample"])
        on_screen.append(None if got is None else got - sent)
        started.append(start["_t"] - sent)
        await asyncio.sleep(GAP_S - 1.0)
    if sock is not None:
        await sock.close()
    return await finish(url, client, on_screen, started)


async def finish(url: str, client: FacecastClient, on_screen: list, started: list) -> dict:
    async with aiohttp.ClientSession() as http:
        sessions = (await (await http.get(f"{url}/sessions")).json())["sessions"]
    server = next((s for s in sessions if s["id"] == client.session_id), {})
    await client.close()
    return {
        "speech_on_screen_s": [None if x is None else round(x, 3) for x in on_screen],
        "playback_started_s": [round(x, 3) for x in started],
        "server": {
            k: server.get(k)
            for k in (
                "ttff_ms",
                "speech_to_lips_p50_ms",
                "speech_to_lips_p95_ms",
                "playout_delay_ms",
                "fresh_share",
            )
        },
    }


async def run(args: argparse.Namespace) -> dict:
    speech = read_pcm(args.wav) if args.wav else espeak(TEXT)
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "facecast", "serve", "--config", args.config]
    cmd += ["--port", str(port), "--device", args.device]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220 - returns at once; the child runs beside the loop
    paths = {}
    try:
        await wait_until_ready(url, 600, server)
        for path in args.path:
            if path == "mic":
                res = await mic_call(url, speech, args.turns, 1.0)
            elif path == "mic-x5":
                res = await mic_call(url, speech, args.turns, 5.0)
            else:
                res = await channel_call(url, speech, args.turns, args.speed, path == "socket")
            paths[path] = res
            print(path, json.dumps(res), flush=True)
    finally:
        server.terminate()
        server.wait(30)
    return {
        "config": args.config,
        "device": args.device,
        "speech_s": round(speech.size / OUTPUT_RATE, 3),
        "command": " ".join(["python bench/agent_bench.py", *sys.argv[1:]]),
        "paths": paths,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--device", default="cpu")
    p.add_argument("--wav", help="the speech to send (default: an espeak-ng sentence)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--speed", type=float, default=5.0, help="utterance push speed")
    p.add_argument(
        "--path",
        action="append",
        choices=["mic", "mic-x5", "channel", "socket"],
        help="repeatable (default: all four)",
    )
    p.add_argument("--json")
    args = p.parse_args()
    args.path = args.path or ["mic", "mic-x5", "channel", "socket"]
    res = asyncio.run(run(args))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
