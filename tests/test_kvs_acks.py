"""The mirror's bytes checked the way AWS's producer CI checks them, and the lost-ack policy.

`--kvs-dump-dir` writes exactly what each PutMedia connection sends; the dump must pass
Debian's `mkvinfo -v` (mkvtoolnix) without an error or a warning and `ffprobe` must find
H.264 and AAC in it. A connection dropped before a fragment's ack makes it be resent
once and stored once; a fragment acknowledged PERSISTED is never resent; one whose
PERSISTED ack is lost is resent (at least once) and its second copy carries the same
producer timestamp and bytes, so it can be dropped (see realtime/kvs/ledger.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections import Counter

import pytest
from support.kvs import (
    FPS,
    KEY,
    REGION,
    SECRET,
    FakeKvsEndpoint,
    assert_clean_timeline,
    feed,
    options,
)

from realtime.kvs import KvsMirror

MKVINFO, FFPROBE = shutil.which("mkvinfo"), shutil.which("ffprobe")


@pytest.fixture
async def endpoint(aws):
    kvs = FakeKvsEndpoint(KEY, SECRET, REGION)
    await kvs.start()
    yield kvs
    await kvs.stop()


async def mirror_run(kvs: FakeKvsEndpoint, frames: int = 520, **overrides):
    mirror = KvsMirror(options(kvs, **overrides), "show", 64, 64, fps=FPS)
    await mirror.start()
    await feed(mirror, frames=frames, speed=10)  # 2 s fragments, five a second
    return await mirror.close()


@pytest.mark.slow
@pytest.mark.skipif(not (MKVINFO and FFPROBE), reason="needs mkvtoolnix and ffmpeg (make sysdeps)")
async def test_the_dump_is_what_was_sent_and_passes_mkvinfo_and_ffprobe(endpoint, tmp_path):
    stats = await mirror_run(endpoint, dump_dir=str(tmp_path))
    dumps = sorted(tmp_path.glob("show-*.mkv"))
    assert [d.name for d in dumps] == ["show-1.mkv"] and stats.fragments_persisted == 11
    data = dumps[0].read_bytes()
    assert data == endpoint.headers["show"].data + b"".join(f.data for f in endpoint.received)

    mkvinfo = await asyncio.to_thread(
        subprocess.run, [MKVINFO, "-v", str(dumps[0])], capture_output=True, text=True, check=False
    )
    assert mkvinfo.returncode == 0, mkvinfo.stdout[-2000:] + mkvinfo.stderr
    problems = [
        line
        for line in (mkvinfo.stdout + mkvinfo.stderr).splitlines()
        if "error" in line.lower() or "warning" in line.lower()
    ]
    assert problems == []
    assert mkvinfo.stdout.count("|+ Cluster") == 11
    assert "Codec ID: V_MPEG4/ISO/AVC" in mkvinfo.stdout
    assert "Codec ID: A_AAC" in mkvinfo.stdout

    probe = await asyncio.to_thread(
        subprocess.run,
        [FFPROBE, "-v", "warning", "-show_streams", "-of", "json", str(dumps[0])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode == 0 and probe.stderr == "", probe.stderr
    streams = {s["codec_type"]: s for s in json.loads(probe.stdout)["streams"]}
    assert (streams["video"]["codec_name"], streams["audio"]["codec_name"]) == ("h264", "aac")
    assert (streams["video"]["width"], streams["video"]["height"]) == (64, 64)


@pytest.mark.slow
async def test_a_fragment_cut_off_before_its_ack_is_resent_once_and_acked_ones_never(endpoint):
    endpoint.disconnect_at(8000, acks_first=True)  # 0..6000 PERSISTED and acked, then the drop
    stats = await mirror_run(endpoint)

    assert len(endpoint.requests) == 2 and stats.errors["disconnect"] == 1
    copies = Counter(f.timecode for f in endpoint.received)  # complete fragments that arrived
    assert all(copies[t] == 1 for t in range(0, 22_000, 2000)), copies
    assert stats.possible_duplicates == 0
    assert_clean_timeline(endpoint, "show", 2000, 11)


@pytest.mark.slow
async def test_a_lost_persisted_ack_resends_a_marked_duplicate(endpoint, caplog):
    endpoint.lose_persisted_ack_at(8000)  # KVS stored it; the ack died with the connection
    stats = await mirror_run(endpoint)

    assert stats.errors["disconnect"] == 1 and stats.possible_duplicates >= 1
    assert [d.timecode for d in endpoint.duplicates] == [8000]
    first = next(f for f in endpoint.fragments("show") if f.timecode == 8000)
    again = endpoint.duplicates[0]
    assert again.request == first.request + 1
    assert (again.producer_ms, again.data) == (first.producer_ms, first.data)
    assert_clean_timeline_but(endpoint, duplicates=1)
    assert "may hold them twice, with the same producer timestamp" in caplog.text


def assert_clean_timeline_but(endpoint: FakeKvsEndpoint, duplicates: int) -> None:
    """No gap, every fragment once in the deduplicated timeline; `duplicates` extra copies."""
    assert len(endpoint.duplicates) == duplicates
    saved = endpoint.duplicates
    endpoint.duplicates = []
    try:
        assert_clean_timeline(endpoint, "show", 2000, 11)
    finally:
        endpoint.duplicates = saved


def test_the_dump_option_is_a_serve_flag():
    import argparse

    from realtime.kvs.options import add_kvs_arguments, options_from_args

    parser = argparse.ArgumentParser()
    add_kvs_arguments(parser)
    args = parser.parse_args(["--kvs-stream", "show", "--kvs-dump-dir", "/tmp/dumps"])
    assert options_from_args(args).dump_dir == "/tmp/dumps"
