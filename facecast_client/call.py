"""One call from the command line, and what a client measured of its call.

    facecast call http://127.0.0.1:8080 --wav hello.wav --out a.mp4

prints time to first frame, fps, the A/V offset and the round trip as JSON (`--utterance`
sends the WAV through the utterance channel instead of the microphone track). Tests and
benchmarks read the same numbers with `call_stats(client)`.

The A/V offset is measured from timestamps: both received tracks are placed on their RTP
timelines (video frame n at n·40 ms, audio by sample), the received audio is aligned with
the audio that was sent by cross-correlation, and the offset is where the sent content
appears in the returned audio relative to the video frame generated from it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np

from facecast_client.client import FacecastClient
from facecast_client.media import PcmSource, Received, read_pcm
from pipeline.clock import (
    FPS,
    MODEL_RATE,
    OUTPUT_RATE,
    OUTPUT_SAMPLES_PER_PACKET,
    VIDEO_CLOCK,
)
from pipeline.media import resample, to_pcm16


def call_stats(client: FacecastClient) -> dict:
    """What the client measured of its call: frames, first frame, frame rate, the A/V offset
    and arrival skew, gaps, the round trip, and the server's last own stats report."""
    rec = client.received
    out: dict = {"frames": len(rec.video_pts), "session_id": client.session_id}
    src = client.source
    if src is not None and src.started_at is not None and rec.video_arrival:
        out["ttff_ms"] = round((rec.video_arrival[0] - src.started_at) * 1000)
    if len(rec.video_arrival) > 1:
        span = rec.video_arrival[-1] - rec.video_arrival[0]
        out["fps"] = round((len(rec.video_arrival) - 1) / span, 2)
        pts_span = (rec.video_pts[-1] - rec.video_pts[0]) / VIDEO_CLOCK
        out["fps_pts"] = round((len(rec.video_pts) - 1) / pts_span, 2) if pts_span else None
    timeline = as_timeline(src.sent if src else np.zeros(0, np.int16), client.events)
    offset = av_offset_ms(rec, timeline)
    if offset is not None:
        out["av_offset_ms"] = round(offset, 1)
    out["arrival_skew_ms"] = arrival_skew_ms(rec)
    if len(rec.video_arrival) > 1:
        out["max_gap_ms"] = round(float(np.diff(rec.video_arrival).max()) * 1000, 1)
    out.update(round_trip(client))
    server = [e for e in client.events if e.get("type") == "stats"]
    if server:  # the server's own counters (fresh share, latencies), last report
        out["server"] = {k: v for k, v in server[-1].items() if k not in ("type", "_t")}
    return out


def round_trip(client: FacecastClient) -> dict:
    """Outside latency: each returned 20 ms of audio (in sync with the lips: see
    `av_offset_ms`) against when the client sent the audio it carries. The server's
    timeline is the sent audio plus inserted silence (`as_timeline`), so returned pts
    P carries sent sample `sent_index(P)`; speech only (silence has nothing to match)."""
    rec, src = client.received, client.source
    if src is None or not rec.audio_pts or src.started_at is None:
        return {}
    inserted = [
        (int(e["at_ms"] * OUTPUT_RATE // 1000), int(e["added_ms"] * OUTPUT_RATE // 1000))
        for e in client.events
        if e.get("type") == "delay_grown"
    ]
    base = rec.audio_pts[0]
    loud = np.abs(src.sent.astype(np.int32))
    lat = []
    for pts, arrived in zip(rec.audio_pts, rec.audio_arrival, strict=True):
        pos = pts - base
        shift = sum(n for at, n in inserted if at <= pos)
        if any(at <= pos < at + n for at, n in inserted):
            continue  # inserted silence was never sent
        sample = pos - shift
        if (
            0 <= sample < loud.size - OUTPUT_SAMPLES_PER_PACKET
            and loud[sample : sample + OUTPUT_SAMPLES_PER_PACKET].max() > 1000
        ):
            lat.append(arrived - src.sent_at[sample // OUTPUT_SAMPLES_PER_PACKET])
    if not lat:
        return {}
    lat.sort()
    return {
        "round_trip_p50_ms": round(lat[len(lat) // 2] * 1000),
        "round_trip_p95_ms": round(lat[int(len(lat) * 0.95)] * 1000),
    }


def as_timeline(sent: np.ndarray, events: list[dict]) -> np.ndarray:
    """The sent audio as the server's session timeline holds it: with the silence the
    server inserted (`delay_grown {at_ms, added_ms}`, timeline positions) to grow its
    playout delay while nobody spoke."""
    parts, done, shift = [], 0, 0  # `done`: sent samples placed; `shift`: inserted so far
    for event in events:
        if event.get("type") != "delay_grown":
            continue
        at = int(event["at_ms"] * OUTPUT_RATE // 1000) - shift  # in sent-audio samples
        parts += [sent[done:at], np.zeros(int(event["added_ms"] * OUTPUT_RATE // 1000), sent.dtype)]
        done, shift = max(done, at), shift + int(event["added_ms"] * OUTPUT_RATE // 1000)
    return np.concatenate([*parts, sent[done:]])


def av_offset_ms(rec: Received, timeline: np.ndarray, max_lag_s: float = 1.0) -> float | None:
    """Where the sent audio appears in the returned audio, in ms, against the video.

    Video frame n (pts n·3600) is generated from timeline [n·40, (n+1)·40) ms (the sent
    audio with the server's inserted silence: `as_timeline`), so a returned audio stream in
    sync with the video carries timeline time t at audio pts t: lag 0.
    """
    got = rec.audio_timeline().astype(np.float32)
    ref = timeline.astype(np.float32)
    n = min(got.size, ref.size)
    if n < OUTPUT_RATE or not rec.video_pts or np.abs(ref[:n]).max() == 0 or np.abs(got).max() == 0:
        return None
    # Both timelines start at their stream's first packet; video pts 0 is frame 0.
    lag = _best_lag(got[:n], ref[:n], int(max_lag_s * OUTPUT_RATE))
    video_origin = rec.video_pts[0] / VIDEO_CLOCK  # nonzero only if frame 0 was lost
    return lag / OUTPUT_RATE * 1000 - video_origin * 1000


def _best_lag(got: np.ndarray, ref: np.ndarray, max_lag: int) -> int:
    size = 1 << int(np.ceil(np.log2(got.size + ref.size)))
    corr = np.fft.irfft(np.fft.rfft(got, size) * np.conj(np.fft.rfft(ref, size)), size)
    lags = np.concatenate([np.arange(0, max_lag + 1), np.arange(-max_lag, 0)])
    values = np.concatenate([corr[: max_lag + 1], corr[size - max_lag :]])
    return int(lags[int(np.argmax(values))])


def arrival_skew_ms(rec: Received, since: float = -math.inf) -> float | None:
    """Median (arrival − pts time) of video minus that of audio: how far apart they arrive,
    over what arrived from `since` (time.monotonic) on."""
    v_arrival, a_arrival = np.array(rec.video_arrival), np.array(rec.audio_arrival)
    v_kept, a_kept = v_arrival >= since, a_arrival >= since
    if not v_kept.any() or not a_kept.any():
        return None
    v = np.median((v_arrival - np.array(rec.video_pts) / VIDEO_CLOCK)[v_kept])
    a0 = rec.audio_pts[0]
    a = np.median((a_arrival - (np.array(rec.audio_pts) - a0) / OUTPUT_RATE)[a_kept])
    return round(float(v - a) * 1000, 1)


# ---- command line --------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict:
    if args.wav:
        pcm = await asyncio.to_thread(read_pcm, args.wav)
    else:
        raw = np.frombuffer(await asyncio.to_thread(Path(args.pcm).read_bytes), np.int16)
        pcm = to_pcm16(resample(raw / 32768.0, args.pcm_rate, OUTPUT_RATE))
    seconds = args.seconds or (pcm.size / OUTPUT_RATE + 3.0)
    if args.utterance:  # no microphone: the WAV is one utterance on the data channel
        client = FacecastClient(args.url, None, token=args.token, record_to=args.out)
        await client.connect()
        try:
            await client.wait_channel_open()
            await client.wait_frames(FPS, timeout=60)  # on screen, idle
            sent = time.monotonic()
            await client.speech.say(pcm, OUTPUT_RATE, speed=args.speed)
            started = await client.wait_event("playback_started", 60, sent)
            finished = await client.wait_event("playback_finished", seconds + 60, sent)
        finally:
            await client.close()
        stats = call_stats(client)
        stats["playback_started_ms"] = round((started["_t"] - sent) * 1000)
        stats["playback_position_s"] = finished["playback_position"]
    else:
        source = PcmSource(pcm, speed=args.speed, loop=args.loop)
        client = FacecastClient(args.url, source, token=args.token, record_to=args.out)
        await client.connect()
        try:
            await asyncio.sleep(seconds)
        finally:
            await client.close()
        stats = call_stats(client)
    counts: dict[str, int] = {}
    for e in client.events:
        counts[e["type"]] = counts.get(e["type"], 0) + 1
    stats["events"] = counts
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="facecast call",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--wav", help="audio file to send (any format PyAV reads)")
    src.add_argument("--pcm", help="raw s16le mono PCM file to send")
    parser.add_argument("--pcm-rate", type=int, default=MODEL_RATE)
    parser.add_argument("--speed", type=float, default=1.0, help=">1 sends faster than real time")
    parser.add_argument(
        "--seconds", type=float, default=0, help="call length (default: audio + 3 s)"
    )
    parser.add_argument("--loop", action="store_true", help="send the audio again and again")
    parser.add_argument(
        "--utterance",
        action="store_true",
        help="no microphone: send the audio as one utterance (at --speed) on the data channel",
    )
    parser.add_argument("--out", help="record the returned avatar to this MP4")
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stats = asyncio.run(run(args))
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
