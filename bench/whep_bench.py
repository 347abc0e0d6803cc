"""WHEP viewers of one `facecast serve` session, measured from the players' side.

    python bench/whep_bench.py --config demo --wav speech.wav --viewers 3 --seconds 20 \
        [--codec video/vp8] [--json bench/results/whep_demo_cpu.json]

starts `facecast serve` (a subprocess, as a user would), opens one session with the
project's aiortc client speaking the WAV in a loop, lets it run `--warmup` seconds, then
measures the server process's CPU (user + system seconds per second, from /proc) with no
viewer, and again with `--viewers` WHEP players (plain aiortc, recvonly, POST
application/sdp) watching for `--seconds`. Reported per viewer: time from its POST to its
first decoded frame, fps, frames missing (pts gaps), the share of its pictures identical to
the first viewer's at the same frame; and the server's counters: engine sessions, frames
generated, WHEP frames encoded (per codec) and sent.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urljoin

import aiohttp
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import free_port, gpu_name, metric_values  # noqa: E402

from facecast_client import FacecastClient, PcmSource, wait_until_ready  # noqa: E402
from pipeline.clock import FPS, VIDEO_TICKS_PER_FRAME  # noqa: E402
from pipeline.media import read_audio  # noqa: E402


class Player:
    """A WHEP player: a recvonly offer POSTed as application/sdp, DELETE to leave."""

    def __init__(self, codec: str | None) -> None:
        self.pc = RTCPeerConnection()
        self.codec = codec
        self.video: list[tuple[int, float, str]] = []  # pts, arrival, picture digest
        self.posted = 0.0
        self.location: str | None = None
        self._tasks: list[asyncio.Task] = []

    async def watch(self, http: aiohttp.ClientSession, endpoint: str) -> None:
        self.pc.addTransceiver("audio", direction="recvonly")
        video = self.pc.addTransceiver("video", direction="recvonly")
        if self.codec:
            caps = RTCRtpReceiver.getCapabilities("video").codecs
            wanted = (self.codec, "video/rtx")
            video.setCodecPreferences([c for c in caps if c.mimeType.lower() in wanted])
        self.pc.on("track", lambda t: self._tasks.append(asyncio.ensure_future(self._eat(t))))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self.posted = time.monotonic()
        headers = {"Content-Type": "application/sdp"}
        async with http.post(endpoint, data=self.pc.localDescription.sdp, headers=headers) as r:
            body = await r.text()
            if r.status != 201:
                raise RuntimeError(f"WHEP POST refused ({r.status}): {body}")
            self.location = urljoin(endpoint, r.headers["Location"])
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))

    async def _eat(self, track) -> None:
        try:
            while True:
                frame = await track.recv()
                if track.kind == "video":
                    digest = hashlib.blake2b(frame.to_ndarray().tobytes(), digest_size=8)
                    self.video.append((int(frame.pts), time.monotonic(), digest.hexdigest()))
        except MediaStreamError:
            pass

    async def leave(self, http: aiohttp.ClientSession) -> None:
        if self.location:
            async with http.delete(self.location):
                pass
        await self.pc.close()
        for task in self._tasks:
            task.cancel()

    def stats(self, reference: Player | None) -> dict:
        v = self.video
        out: dict = {"frames": len(v)}
        if not v:
            return out
        out["ttff_ms"] = round((v[0][1] - self.posted) * 1000)
        settled = v[FPS:] if len(v) > 2 * FPS else v  # past the first second
        if len(settled) > 1:
            out["fps"] = round((len(settled) - 1) / (settled[-1][1] - settled[0][1]), 2)
        steps = [b[0] - a[0] for a, b in zip(v, v[1:], strict=False)]
        tick = VIDEO_TICKS_PER_FRAME
        out["frames_missing"] = sum(s // tick - 1 for s in steps if s > tick)
        out["max_gap_ms"] = round(max(b[1] - a[1] for a, b in zip(v, v[1:], strict=False)) * 1000)
        if reference is not None and reference is not self and reference.video:
            digests = [f[2] for f in reference.video]
            if v[0][2] in digests:
                start = digests.index(v[0][2])
                pairs = list(zip(reference.video[start:], v, strict=False))
                same = sum(a[2] == b[2] for a, b in pairs)
                out["identical_to_first_viewer"] = round(same / len(pairs), 4)
            else:
                out["identical_to_first_viewer"] = 0.0
        return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_rate(pid: int, seconds: float) -> float:
    before, t = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - t)


async def run(args: argparse.Namespace) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "facecast", "serve", "--config", args.config, "--port", str(port)]
    cmd += ["--device", args.device] + (["--compile"] if args.compile else []) + args.serve_arg
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: ASYNC230 - once, before the run
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220 - Popen returns at once
    try:
        health = await wait_until_ready(url, args.startup_timeout, server)
        source = PcmSource(read_audio(args.wav), loop=True)
        async with aiohttp.ClientSession() as http, FacecastClient(url, source) as owner:
            await owner.wait_frames(FPS, timeout=120)
            await asyncio.sleep(args.warmup)
            idle_cpu = await cpu_rate(server.pid, args.cpu_window)
            endpoint = f"{url}/whep/{owner.session_id}"
            players = [Player(args.codec) for _ in range(args.viewers)]
            await asyncio.gather(*(p.watch(http, endpoint) for p in players))
            await asyncio.sleep(max(0.0, args.seconds - args.cpu_window))
            viewing_cpu = await cpu_rate(server.pid, args.cpu_window)
            metrics = metric_values(await (await http.get(f"{url}/metrics")).text())
            sessions = (await (await http.get(f"{url}/sessions")).json())["sessions"]
            await asyncio.gather(*(p.leave(http) for p in players))
            owner_stats = owner.stats()
    finally:
        server.terminate()
        server.wait(30)
    first = min(players, key=lambda p: p.posted)
    encoded = {
        k.split('"')[1]: v
        for k, v in metrics.items()
        if k.startswith("facecast_whep_video_frames_encoded_total{")
    }
    return {
        "meta": {
            "config": args.config,
            "machine": gpu_name(),
            "viewers": args.viewers,
            "codec": args.codec or "offer order (VP8)",
            "command": " ".join(["python bench/whep_bench.py", *sys.argv[1:]]),
        },
        "startup_seconds": health.get("startup_seconds"),
        "viewers": [p.stats(first) for p in players],
        "owner": {k: owner_stats.get(k) for k in ("fps", "ttff_ms", "max_gap_ms")},
        "server": {
            "engine_sessions": metrics.get("facecast_sessions_total"),
            "frames_generated": metrics.get("facecast_video_frames_generated_total"),
            "whep_frames_encoded": encoded,
            "whep_frames_sent": metrics.get("facecast_whep_video_frames_sent_total"),
            "viewers_listed": sessions[0].get("viewers") if sessions else None,
            "cpu_cores_no_viewer": round(idle_cpu, 3),
            f"cpu_cores_{args.viewers}_viewers": round(viewing_cpu, 3),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--wav", required=True, help="speech, looped by the session's own client")
    p.add_argument("--viewers", type=int, default=3)
    p.add_argument("--codec", choices=["video/vp8", "video/h264"], help="what viewers offer")
    p.add_argument("--seconds", type=float, default=20.0, help="how long the viewers watch")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--cpu-window", type=float, default=8.0, help="seconds per CPU reading")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--serve-arg", action="append", default=[], help="extra serve flag")
    p.add_argument("--server-log", help="write the server's output here")
    p.add_argument("--json")
    args = p.parse_args()
    res = asyncio.run(run(args))
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
