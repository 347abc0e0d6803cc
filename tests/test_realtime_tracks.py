"""Paced A/V tracks on one clock and the frame queue between generation and playout."""

from __future__ import annotations

import time

import numpy as np
from support.realtime import RATE

from realtime.buffers import FrameQueue, PlaybackTimeline, PlayoutClock
from realtime.metrics import RealtimeMetrics
from realtime.tracks import AvatarAudioTrack, AvatarVideoTrack


async def test_tracks_pace_from_one_clock_with_exact_pts():
    clock, metrics = PlayoutClock(), RealtimeMetrics()
    frames = FrameQueue(lead_frames=50, capacity=100)
    tl = PlaybackTimeline()
    tl.append((np.arange(RATE) % 100).astype(np.int16))
    played = []
    video = AvatarVideoTrack(clock, frames, (32, 24), metrics, [], "test")
    audio = AvatarAudioTrack(clock, tl, [], "test", played.append)
    pics = np.stack([np.full((24, 32, 3), i, np.uint8) for i in range(12)])
    frames.put([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11], np.delete(pics, 4, axis=0))  # 4 missing
    t0 = time.monotonic() + 0.05
    clock.start(t0)
    vframes = [await video.recv() for _ in range(10)]
    v_elapsed = time.monotonic() - t0
    aframes = [await audio.recv() for _ in range(5)]
    assert [f.pts for f in vframes] == [n * 3600 for n in range(10)]
    assert vframes[0].time_base.denominator == 90_000
    assert v_elapsed >= 9 * 0.04 - 0.005, "recv must wait for each frame's deadline"
    shown = [int(f.to_ndarray(format="rgb24")[0, 0, 0]) for f in vframes]
    assert shown[4] == shown[3] and video.repeated == 1  # late frame: the last one repeats
    assert [f.pts for f in aframes] == [k * 960 for k in range(5)]
    assert all(f.samples == 960 and f.sample_rate == RATE for f in aframes)
    first = aframes[0].to_ndarray().reshape(-1)
    assert list(first[:5]) == [0, 1, 2, 3, 4] and played[-1] == 5 * 960


async def test_video_track_survives_bad_frames_and_skips_when_behind():
    clock, metrics = PlayoutClock(), RealtimeMetrics()
    frames = FrameQueue(lead_frames=50, capacity=100)
    video = AvatarVideoTrack(clock, frames, (16, 16), metrics, [], "test")
    frames.put([0, 1], [np.zeros((16, 16, 3), np.uint8), np.zeros((5, 5), np.float32)])
    clock.start(time.monotonic() - 1.0)  # a second late: deadlines are skipped, not queued
    f0 = await video.recv()
    f1 = await video.recv()
    assert f0.pts >= 24 * 3600 and f1.pts == f0.pts + 3600
    assert f0.width == 16 and video.dropped >= 1
    # the skipped deadlines are frames the viewer never got: counted, and not fresh
    assert video.missed == f0.pts // 3600 >= 24
    scrape = metrics.registry.get_sample_value
    assert scrape("facecast_video_deadlines_missed_total") == video.missed
    fresh = scrape("facecast_video_fresh_share")
    assert fresh < 0.1, "two frames sent over ~26 deadlines: the share says so"


def test_frame_queue_waits_for_room():
    import threading

    frames = FrameQueue(lead_frames=2, capacity=10)
    stop = threading.Event()
    frames.put([0, 1], np.zeros((2, 4, 4, 3), np.uint8))
    result, play = [], [0]
    worker = threading.Thread(target=lambda: result.append(frames.wait_room(lambda: play[0], stop)))
    worker.start()
    time.sleep(0.2)
    assert not result, "two frames ahead of playout: no room yet"
    play[0] = 1  # playout moves on
    frames.take(1)
    worker.join(2)
    assert result == [True]
    stop.set()
    assert frames.wait_room(lambda: 0, stop) is False
