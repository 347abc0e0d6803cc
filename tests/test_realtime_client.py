"""`facecast call` as a user runs it: raw PCM in, faster than real time, MP4 out."""

from __future__ import annotations

import asyncio
import json
import sys

import av
import numpy as np
import pytest
from support.realtime import espeak, running_server

from pipeline.media import resample, to_pcm16

# The client CLI against a served call, for seconds of speech.
pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
async def test_cli_streams_raw_pcm_and_records_mp4(tmp_path):
    speech48 = np.concatenate([np.zeros(12_000, np.int16), espeak("Testing raw audio.")])
    pcm16k = to_pcm16(resample(speech48 / 32768.0, 48_000, 16_000))
    raw = tmp_path / "speech.s16"
    raw.write_bytes(pcm16k.astype("<i2").tobytes())
    out = tmp_path / "avatar.mp4"
    async with running_server() as (url, app):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "facecast",
            "call",
            url,
            "--pcm",
            str(raw),
            "--pcm-rate",
            "16000",
            "--speed",
            "2",
            "--seconds",
            "5",
            "--out",
            str(out),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    stats = json.loads(stdout.decode().strip().splitlines()[-1])
    assert stats["ttff_ms"] > 0 and stats["frames"] > 50, stats
    assert 23 <= stats["fps"] <= 27 and "av_offset_ms" in stats, stats
    assert "speech_started" in stats["events"]
    with av.open(str(out)) as box:
        video = box.streams.video[0]
        assert video.codec_context.name == "h264" and box.streams.audio
        assert sum(1 for _ in box.decode(video=0)) >= stats["frames"] - 2
