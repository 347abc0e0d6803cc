"""Options of the KVS mirror, the `facecast serve` flags that set them, and stream naming."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass

from pipeline.clock import OUTPUT_RATE
from realtime.kvs.errors import KvsConfigError

ENDPOINT_ENV = "FACECAST_KVS_ENDPOINT_URL"
STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,256}")  # fullmatch: "$" would allow a final "\n"
MAX_FRAGMENTS_PER_S = 5.0  # a PutMedia limit per stream


@dataclass(frozen=True)
class KvsOptions:
    """Everything the mirror needs; `stream` None means mirroring is off."""

    stream: str | None = None
    region: str | None = None
    create: bool = False
    endpoint_url: str | None = None  # replaces the PutMedia data endpoint (local testing)
    retention_hours: int = 24  # for streams created with --kvs-create; HLS needs > 0
    fragment_s: float = 2.0
    retry_buffer_s: float = 60.0  # unpersisted media kept for resending
    input_buffer_s: float = 2.0  # frames waiting for the encoder before new ones are dropped
    idle_fill_after_s: float = 1.0  # input this late is replaced by the last frame and silence
    audio_channels: int = 1
    video_bitrate: int = 2_000_000
    audio_bitrate: int = 128_000
    x264_preset: str = "veryfast"
    encoder_nice: int = 10  # the encoder thread yields CPU to generation and WebRTC
    endpoint_refresh_s: float = 45 * 60.0
    max_fragments_per_s: float = MAX_FRAGMENTS_PER_S
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 20.0
    ack_timeout_s: float = 20.0  # no ack at all for this long while fragments wait: reconnect
    max_attempts: int = 5  # sends of one fragment before it counts as failed
    close_timeout_s: float = 10.0  # below the session's 15 s limit for closing sinks
    dump_dir: str | None = None  # write the bytes of each PutMedia connection here

    @property
    def enabled(self) -> bool:
        return self.stream is not None

    def validate(self, fps: int) -> None:
        if self.stream is not None:
            check_stream_name(self.stream)
        frames = self.fragment_frames(fps)
        if abs(frames / fps - self.fragment_s) > 1e-6 or (1000 * frames) % fps:
            raise KvsConfigError(
                f"--kvs-fragment-seconds {self.fragment_s} is not a whole number of "
                f"{fps} fps frames with a whole number of milliseconds; try 2.0 or 1.0"
            )
        if frames / fps < 1.0 / self.max_fragments_per_s - 1e-9:
            raise KvsConfigError(
                f"--kvs-fragment-seconds {self.fragment_s} gives more than "
                f"{self.max_fragments_per_s:g} fragments per second, the PutMedia limit; "
                f"use at least {1.0 / self.max_fragments_per_s:g}"
            )
        if frames / fps > 10.0:
            raise KvsConfigError(
                "KVS fragments may last at most 10 s; lower --kvs-fragment-seconds"
            )
        if OUTPUT_RATE % fps:
            raise KvsConfigError(f"fps {fps} does not divide 48 kHz audio evenly")
        if self.audio_channels not in (1, 2):
            raise KvsConfigError(f"audio_channels must be 1 or 2, got {self.audio_channels}")
        if self.retry_buffer_s < self.fragment_s:
            raise KvsConfigError("--kvs-retry-buffer-seconds must hold at least one fragment")
        if self.create and self.retention_hours <= 0:
            raise KvsConfigError("--kvs-retention-hours must be > 0 (HLS playback needs it)")

    def fragment_frames(self, fps: int) -> int:
        return max(1, round(self.fragment_s * fps))


def check_stream_name(name: str) -> str:
    if not STREAM_NAME.fullmatch(name):
        raise KvsConfigError(
            f"invalid KVS stream name {name!r}: use 1-256 letters, digits, '_', '.' or '-'"
        )
    return name


class StreamNamer:
    """One KVS stream per session: an explicit name wins, else NAME, NAME-2, NAME-3, ..."""

    def __init__(self, base: str) -> None:
        self._base = check_stream_name(base)
        self._count = 0

    def next_name(self, requested: str | None = None) -> str:
        if requested:
            return check_stream_name(requested)
        self._count += 1
        name = self._base if self._count == 1 else f"{self._base}-{self._count}"
        return check_stream_name(name)


def add_kvs_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Kinesis Video Streams mirror")
    group.add_argument(
        "--kvs-stream",
        metavar="NAME",
        help="mirror each session to KVS: NAME for the first, NAME-2, NAME-3, ... after it "
        "(an offer's kvs_stream option names its own stream)",
    )
    group.add_argument("--kvs-region", metavar="R", help="AWS region (default: the AWS config)")
    group.add_argument(
        "--kvs-create", action="store_true", help="create missing streams (retention > 0)"
    )
    group.add_argument(
        "--kvs-endpoint-url",
        metavar="URL",
        default=os.environ.get(ENDPOINT_ENV),
        help=f"replace the PutMedia data endpoint, for local testing (env {ENDPOINT_ENV})",
    )
    group.add_argument("--kvs-retention-hours", type=int, default=24, metavar="H")
    group.add_argument("--kvs-fragment-seconds", type=float, default=2.0, metavar="S")
    group.add_argument(
        "--kvs-retry-buffer-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="media kept for resending until KVS persists it",
    )
    group.add_argument(
        "--kvs-dump-dir",
        metavar="DIR",
        help="write exactly the bytes each PutMedia connection sends to DIR/STREAM-N.mkv, "
        "to check them with mkvinfo or ffprobe",
    )


def options_from_args(args: argparse.Namespace) -> KvsOptions:
    options = KvsOptions(
        stream=args.kvs_stream,
        region=args.kvs_region,
        create=args.kvs_create,
        endpoint_url=args.kvs_endpoint_url or os.environ.get(ENDPOINT_ENV) or None,
        retention_hours=args.kvs_retention_hours,
        fragment_s=args.kvs_fragment_seconds,
        retry_buffer_s=args.kvs_retry_buffer_seconds,
        dump_dir=args.kvs_dump_dir,
    )
    if options.stream is not None:
        check_stream_name(options.stream)
    return options
