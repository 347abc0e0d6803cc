"""`make soak`: one long call against `facecast serve` on the CPU, measured every 30 s.

    python bench/soak.py [--minutes 60] [--interval 30] [--interrupt-every 60]
        [--config demo] [--json bench/results/soak_cpu.json] [--markdown bench/RESULTS.md]

It starts `facecast serve` (the default config unless --config) on the CPU on a free
loopback port, connects one aiortc client that speaks espeak-ng utterances with pauses
in a loop, in real time like a microphone, and interrupts over the data channel every
minute. Every interval it samples the server's processes (the server and its engine
process: RSS, threads, open fds, from /proc), the server's frame counters (fresh,
repeated, dropped, skipped: /metrics), generation's real-time factor, the session's
speech-to-lips latency (/sessions), and the client's video arrivals: a gap
over 200 ms between two received frames is a stall. At the end it writes JSON and the
soak section of bench/RESULTS.md, judged against issue 18's targets: RSS growth <= 5%
from minute 5 to the end, threads and fds flat, no stall over 200 ms while generation
keeps up (RTF < 1).

The client keeps no history (counters only), so an hour costs it no memory.
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import io
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from facecast_client import wait_until_ready
from pipeline.clock import OUTPUT_RATE, OUTPUT_SAMPLES_PER_PACKET

ROOT = Path(__file__).resolve().parent.parent
STALL_S = 0.2
SECTION_BEGIN, SECTION_END = "<!-- facecast-soak:begin -->", "<!-- facecast-soak:end -->"
UTTERANCES = [
    "Hello, this is a long call to see that nothing grows.",
    "The avatar keeps talking, and then it listens for a while.",
    "Every minute the speaker interrupts, like a person would.",
    "Numbers are read every thirty seconds from the server.",
    "Memory, threads and open files should all stay flat.",
]
PAUSES_S = [1.5, 3.0, 0.8, 4.0, 2.2]  # silences between utterances (the avatar idles)


# ---- speech -----------------------------------------------------------------------


def espeak(text: str) -> np.ndarray:
    """One utterance as int16 mono 48 kHz, made offline by espeak-ng."""
    wav = subprocess.run(
        ["espeak-ng", "-s", "165", "--stdout", text], check=True, capture_output=True
    ).stdout
    resampler = av.AudioResampler(format="s16", layout="mono", rate=OUTPUT_RATE)
    with av.open(io.BytesIO(wav), format="wav") as box:
        parts = [
            f.to_ndarray().reshape(-1) for fr in box.decode(audio=0) for f in resampler.resample(fr)
        ]
    parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(parts).astype(np.int16)


def speech_loop() -> np.ndarray:
    """The looped programme: each utterance followed by its pause."""
    parts = []
    for text, pause in zip(UTTERANCES, PAUSES_S, strict=True):
        parts += [espeak(text), np.zeros(int(pause * OUTPUT_RATE), np.int16)]
    return np.concatenate(parts)


class LoopedMic(MediaStreamTrack):
    """Outgoing audio: the programme over and over, paced at real time, 20 ms a frame."""

    kind = "audio"

    def __init__(self, programme: np.ndarray) -> None:
        super().__init__()
        self._pcm = np.concatenate(
            [programme, programme[:OUTPUT_SAMPLES_PER_PACKET]]
        )  # a frame may wrap
        self._index = 0
        self._t0: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        self._t0 = self._t0 or time.monotonic()
        delay = self._t0 + self._index * OUTPUT_SAMPLES_PER_PACKET / OUTPUT_RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        start = (
            self._index * OUTPUT_SAMPLES_PER_PACKET % (self._pcm.size - OUTPUT_SAMPLES_PER_PACKET)
        )
        frame = av.AudioFrame.from_ndarray(
            self._pcm[start : start + OUTPUT_SAMPLES_PER_PACKET].reshape(1, -1),
            format="s16",
            layout="mono",
        )
        frame.sample_rate, frame.pts = OUTPUT_RATE, self._index * OUTPUT_SAMPLES_PER_PACKET
        frame.time_base = fractions.Fraction(1, OUTPUT_RATE)
        self._index += 1
        return frame


# ---- the client -------------------------------------------------------------------


@dataclass
class VideoWatch:
    """Counters of received video since the last `take()`: no history is kept."""

    frames: int = 0
    max_gap_s: float = 0.0
    stalls: int = 0  # gaps over STALL_S
    last_at: float | None = None

    def frame(self, now: float) -> None:
        if self.last_at is not None:
            gap = now - self.last_at
            self.max_gap_s = max(self.max_gap_s, gap)
            self.stalls += gap > STALL_S
        self.last_at = now
        self.frames += 1

    def take(self) -> dict:
        out = {
            "frames": self.frames,
            "max_gap_ms": round(self.max_gap_s * 1000),
            "stalls": self.stalls,
        }
        self.frames, self.max_gap_s, self.stalls = 0, 0.0, 0
        return out


@dataclass
class SoakClient:
    url: str
    pc: RTCPeerConnection = field(default_factory=lambda: RTCPeerConnection(RTCConfiguration([])))
    video: VideoWatch = field(default_factory=VideoWatch)
    session_id: str | None = None
    interrupts: list[dict] = field(default_factory=list)
    closed_reason: str | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)

    async def connect(self, mic: LoopedMic) -> None:
        self.pc.addTrack(mic)
        self.pc.addTransceiver("video", direction="recvonly")
        self.channel = self.pc.createDataChannel("facecast")
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        self._asked: float | None = None
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        async with aiohttp.ClientSession() as http, http.post(f"{self.url}/offer", json=offer) as r:
            body = await r.json()
            if r.status != 200:
                raise RuntimeError(f"offer refused ({r.status}): {body}")
        self.session_id = body["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(body["sdp"], body["type"]))

    def _on_track(self, track: MediaStreamTrack) -> None:
        self.tasks.append(asyncio.ensure_future(self._consume(track)))

    async def _consume(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                await track.recv()
                if track.kind == "video":
                    self.video.frame(time.monotonic())
        except MediaStreamError:
            pass

    def _on_message(self, raw: str) -> None:
        msg = json.loads(raw)
        if msg["type"] == "interrupted" and self._asked is not None:
            answer_ms = round((time.monotonic() - self._asked) * 1000)
            self.interrupts.append({"played_ms": msg["played_ms"], "answer_ms": answer_ms})
            self._asked = None
        elif msg["type"] == "session_closed":
            self.closed_reason = msg.get("reason")

    def interrupt(self) -> None:
        if self.channel.readyState == "open":
            self._asked = time.monotonic()
            self.channel.send(json.dumps({"type": "interrupt"}))

    async def close(self) -> None:
        if self.session_id:
            async with aiohttp.ClientSession() as http:
                await http.delete(f"{self.url}/sessions/{self.session_id}")
        await self.pc.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


# ---- sampling the server ----------------------------------------------------------

COUNTERS = {
    "sent": "facecast_video_frames_sent_total",
    "fresh": "facecast_video_frames_fresh_total",
    "repeated": "facecast_video_frames_repeated_total",
    "dropped": "facecast_video_frames_dropped_total",
    "skipped": "facecast_generation_skipped_frames_total",
    "rtf_sum": "facecast_generation_realtime_factor_sum",
    "rtf_count": "facecast_generation_realtime_factor_count",
}


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the server spawns its engine as a child process)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def proc_stats(pid: int) -> dict:
    """RSS, threads and fds of the server's processes, summed (shared pages count twice)."""
    total = {"rss_mb": 0.0, "threads": 0, "fds": 0, "processes": 0}
    for proc in process_tree(pid):
        try:
            status = Path(f"/proc/{proc}/status").read_text().splitlines()
            fds = len(os.listdir(f"/proc/{proc}/fd"))
        except OSError:  # it exited meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status if ":" in line)
        total["rss_mb"] += int(fields["VmRSS"].split()[0]) / 1024
        total["threads"] += int(fields["Threads"])
        total["fds"] += fds
        total["processes"] += 1
    total["rss_mb"] = round(total["rss_mb"], 1)
    return total


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS.values():
            values[name] = float(value)
    return {key: values.get(name, 0.0) for key, name in COUNTERS.items()}


async def server_counters(http: aiohttp.ClientSession, url: str) -> tuple[dict, dict | None]:
    async with http.get(f"{url}/metrics") as r:
        metrics = parse_metrics(await r.text())
    async with http.get(f"{url}/sessions") as r:
        sessions = (await r.json())["sessions"]
    return metrics, sessions[0] if sessions else None


# ---- the run ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def soak(args: argparse.Namespace, log_path: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "facecast", "--log-level", "warning", "serve"]
    command += ["--device", "cpu", "--port", str(port)] + (
        ["--config", args.config] if args.config else []
    )
    with open(log_path, "wb") as server_log:  # noqa: ASYNC230 - once, before the call
        proc = subprocess.Popen(command, cwd=ROOT, stdout=server_log, stderr=subprocess.STDOUT)  # noqa: ASYNC220 - Popen returns at once; the child runs beside the loop
    try:
        await wait_until_ready(url, process=proc)
        return await measure(args, url, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # a graceful stop: on_shutdown closes the peer
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


async def measure(args: argparse.Namespace, url: str, proc: subprocess.Popen) -> dict:
    client = SoakClient(url)
    await client.connect(LoopedMic(await asyncio.to_thread(speech_loop)))
    samples: list[dict] = []
    start = time.monotonic()
    next_interrupt = start + args.interrupt_every
    async with aiohttp.ClientSession() as http:
        previous, _ = await server_counters(http, url)
        for n in range(1, int(args.minutes * 60 / args.interval) + 1):
            due = start + n * args.interval
            while (now := time.monotonic()) < due:
                if now >= next_interrupt:
                    client.interrupt()
                    next_interrupt += args.interrupt_every
                await asyncio.sleep(min(due, next_interrupt) - now)
            counters, session = await server_counters(http, url)
            samples.append(sample(n * args.interval, proc.pid, previous, counters, session, client))
            previous = counters
            print(json.dumps(samples[-1]), flush=True)
            if client.closed_reason or session is None:
                print(f"the session ended early: {client.closed_reason}", flush=True)
                break
    await client.close()
    return {"samples": samples, "interrupts": client.interrupts}


def sample(
    t: float, pid: int, before: dict, after: dict, session: dict | None, client: SoakClient
) -> dict:
    delta = {key: after[key] - before[key] for key in COUNTERS}
    rtf = delta["rtf_sum"] / delta["rtf_count"] if delta["rtf_count"] else None
    lips = None if session is None else session.get("speech_to_lips_p50_ms")
    return {
        "t_s": round(t),
        **proc_stats(pid),
        "fresh": int(delta["fresh"]),
        "repeated": int(delta["repeated"]),
        "dropped": int(delta["dropped"]),
        "skipped": int(delta["skipped"]),
        "rtf": None if rtf is None else round(rtf, 3),
        "queue_depth": None if session is None else session["queue_depth"],
        "speech_to_lips_p50_ms": lips,
        "client": client.video.take(),
    }


# ---- judging and reporting --------------------------------------------------------


def flat(values: list[int]) -> bool:
    """No new high in the second half: a pool that grew during warm-up and then stays, or
    a count that moves up and down, is flat; a leak keeps setting new highs."""
    half = len(values) // 2
    return len(values) < 2 or max(values[half:]) <= max(values[:half])


def summarize(samples: list[dict], interrupts: list[dict]) -> dict:
    """Issue 18's targets, judged from minute 5 (or a quarter of a shorter run) to the end:
    the first minutes hold warm-up allocations (codecs, thread pools) that then stay."""
    end = samples[-1]["t_s"]
    ref = next(s for s in samples if s["t_s"] >= min(300, end / 4))
    judged = samples[samples.index(ref) :]
    growth = (samples[-1]["rss_mb"] - ref["rss_mb"]) / ref["rss_mb"] * 100
    threads = [s["threads"] for s in judged]
    fds = [s["fds"] for s in judged]
    rtfs = [s["rtf"] for s in samples if s["rtf"] is not None]
    keeps_up = [s for s in samples if s["rtf"] is not None and s["rtf"] < 1.0]
    stalls_keeping_up = sum(s["client"]["stalls"] for s in keeps_up)
    totals = {k: sum(s[k] for s in samples) for k in ("fresh", "repeated", "dropped", "skipped")}
    return {
        "duration_s": end,
        "rss_ref_t_s": ref["t_s"],
        "rss_growth_pct": round(growth, 2),
        "rss_mb": [min(s["rss_mb"] for s in samples), max(s["rss_mb"] for s in samples)],
        "threads": [min(threads), max(threads)],
        "fds": [min(fds), max(fds)],
        "rtf_mean": round(sum(rtfs) / len(rtfs), 3) if rtfs else None,
        "stalls": sum(s["client"]["stalls"] for s in samples),
        "stalls_while_keeping_up": stalls_keeping_up,
        "max_gap_ms": max(s["client"]["max_gap_ms"] for s in samples),
        "interrupts": len(interrupts),
        "interrupt_answer_ms_max": max((i["answer_ms"] for i in interrupts), default=None),
        **totals,
        "targets": {
            "rss_growth_le_5pct": growth <= 5.0,
            "threads_flat": flat(threads),
            "fds_flat": flat(fds),
            "no_stall_over_200ms_while_keeping_up": stalls_keeping_up == 0,
        },
    }


def markdown(result: dict) -> str:
    s, rows = result["summary"], result["samples"]
    ok = lambda flag: "yes" if flag else "**no**"  # noqa: E731
    t = s["targets"]
    lines = [
        f"{result['date']} · {result['machine']} · commit `{result['commit']}` · "
        f"{s['duration_s'] / 60:.0f} min, one call, config `{result['config']}`",
        f"Command: `{result['command']}`",
        "",
        f"RSS {s['rss_mb'][0]}–{s['rss_mb'][1]} MB, growth from {s['rss_ref_t_s']} s to the end "
        f"{s['rss_growth_pct']:+.1f}% (target ≤ 5%: {ok(t['rss_growth_le_5pct'])}) · from then on threads "
        f"{s['threads'][0]}–{s['threads'][1]} (flat: {ok(t['threads_flat'])}) · fds "
        f"{s['fds'][0]}–{s['fds'][1]} (flat: {ok(t['fds_flat'])}) · generation RTF mean "
        f"{s['rtf_mean']} · frames fresh/repeated/dropped/skipped {s['fresh']}/{s['repeated']}/"
        f"{s['dropped']}/{s['skipped']} · client stalls > 200 ms {s['stalls']} "
        f"({s['stalls_while_keeping_up']} while generation kept up: "
        f"{ok(t['no_stall_over_200ms_while_keeping_up'])}), longest gap {s['max_gap_ms']} ms · "
        f"{s['interrupts']} interrupts, answered within {s['interrupt_answer_ms_max']} ms",
        "",
        "| t (s) | RSS (MB) | threads | fds | fresh | repeated | dropped | skipped | RTF | "
        "client frames | longest gap (ms) | stalls |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        c = r["client"]
        lines.append(
            f"| {r['t_s']} | {r['rss_mb']} | {r['threads']} | {r['fds']} | {r['fresh']} | "
            f"{r['repeated']} | {r['dropped']} | {r['skipped']} | {r['rtf']} | {c['frames']} | "
            f"{c['max_gap_ms']} | {c['stalls']} |"
        )
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, block: str) -> None:
    """Replace the soak section of RESULTS.md with this run (other sections untouched)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if SECTION_BEGIN not in text:
        text = text.rstrip("\n") + (
            f"\n\n## Long call on the CPU (`make soak`, issue 18)\n\n{SECTION_BEGIN}\n{SECTION_END}\n"
        )
    head, rest = text.split(SECTION_BEGIN, 1)
    tail = rest.split(SECTION_END, 1)[1]
    path.write_text(f"{head}{SECTION_BEGIN}\n{block}{SECTION_END}{tail}")


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--interrupt-every", type=float, default=60.0, metavar="S")
    parser.add_argument("--config", default=None, help="engine preset (default: serve's default)")
    parser.add_argument("--json", default=str(ROOT / "bench/results/soak_cpu.json"))
    parser.add_argument("--markdown", default=str(ROOT / "bench/RESULTS.md"))
    args = parser.parse_args(argv)
    if shutil.which("espeak-ng") is None:
        raise SystemExit("soak: espeak-ng is missing (make sysdeps)")
    if args.minutes * 60 < 2 * args.interval:
        raise SystemExit("soak: run for at least two sampling intervals")
    log_path = Path(tempfile.gettempdir()) / "facecast-soak-server.log"
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run = asyncio.run(soak(args, log_path))
    from pipeline.config import DEFAULT_CONFIG

    result = {
        "command": "python bench/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": started,
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, {platform.python_version()}",
        "commit": commit(),
        "config": args.config or DEFAULT_CONFIG,
        **run,
        "summary": summarize(run["samples"], run["interrupts"]),
        "server_log": str(log_path),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    write_markdown(Path(args.markdown), markdown(result))
    print(json.dumps(result["summary"], indent=2))
    return 0 if all(result["summary"]["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
