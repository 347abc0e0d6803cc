"""The client's microphone-like source (`facecast_client.media.PcmSource`): what it sends
in a looped call is the clip again and again, 20 ms a frame, and what it says it sent is
exactly that, read at any point of the call."""

from __future__ import annotations

import numpy as np

from facecast_client.media import PcmSource
from pipeline.clock import OUTPUT_SAMPLES_PER_PACKET


async def test_a_looped_source_sends_the_clip_seamlessly_and_records_what_it_sent():
    rng = np.random.default_rng(0)
    clip = rng.integers(-3000, 3000, 2 * OUTPUT_SAMPLES_PER_PACKET + 123, dtype=np.int16)
    src = PcmSource(clip, speed=1000.0, loop=True)  # paced 1000x: the test takes no time
    frames = []
    for i in range(60):
        frame = await src.recv()
        assert frame.pts == i * OUTPUT_SAMPLES_PER_PACKET and frame.sample_rate == 48_000
        frames.append(frame.to_ndarray().reshape(-1))
        if i == 25:  # read mid-call (an aligner may), then the call goes on
            assert np.array_equal(src.sent, np.concatenate(frames))
    sent = np.concatenate(frames)
    assert sent.size == 60 * OUTPUT_SAMPLES_PER_PACKET
    assert np.array_equal(sent, np.tile(clip, sent.size // clip.size + 1)[: sent.size])
    assert np.array_equal(src.sent, sent) and src.ended_at is None  # a loop never runs out
    assert len(src.sent_at) == 60
    src.stop()
