"""The pieces of a session, one at a time: resampling, VAD, timeline, paced tracks, events."""

from __future__ import annotations

import asyncio
import json
import time

import av
import numpy as np
import pytest
from realtime_helpers import RATE, make_speech_wav

from realtime.audio_in import InputResampler, PlaybackTimeline
from realtime.errors import BadRequest
from realtime.events import PlaybackTracker, parse_client_message
from realtime.metrics import RealtimeMetrics
from realtime.tracks import AvatarAudioTrack, AvatarVideoTrack, FrameQueue, PlayoutClock
from realtime.vad import VoiceActivityDetector


def stereo_frame(pcm: np.ndarray) -> av.AudioFrame:
    """What aiortc's Opus decoder yields: 48 kHz stereo s16, interleaved."""
    inter = np.repeat(pcm.astype(np.int16), 2).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(inter, format="s16", layout="stereo")
    frame.sample_rate = RATE
    return frame


def test_resampler_downmixes_and_keeps_the_pitch():
    t = np.arange(RATE) / RATE
    tone = (8000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    r = InputResampler()
    mono48 = np.concatenate(
        [r.mono48(stereo_frame(tone[i : i + 960])) for i in range(0, RATE, 960)]
    )
    pcm16 = np.concatenate([r.to16(mono48[i : i + 960]) for i in range(0, mono48.size, 960)])
    assert abs(mono48.size - RATE) < 100 and abs(pcm16.size - 16000) < 100
    spectrum = np.abs(np.fft.rfft(pcm16[1000:15000]))
    peak_hz = np.argmax(spectrum) * 16000 / 14000
    assert abs(peak_hz - 1000) < 5
    assert pcm16.dtype == np.float32 and np.abs(pcm16).max() <= 1.0


def test_vad_finds_speech_edges_within_100_ms(tmp_path):
    plan = [
        0.8,
        "Hello there, how are you today?",
        1.2,
        "The quick brown fox jumps.",
        1.0,
        "Seven, eight, nine.",
        0.9,
        "Good bye then.",
        0.7,
    ]
    wav = make_speech_wav(tmp_path / "v.wav", plan)
    r, vad = InputResampler(), VoiceActivityDetector()
    events = []
    for i in range(0, wav.pcm.size, 960):  # 20 ms frames, as WebRTC delivers them
        events += vad.feed(r.to16(wav.pcm[i : i + 960]))
    starts = [e.ms / 1000 for e in events if e.kind == "speech_started"]
    stops = [e.ms / 1000 for e in events if e.kind == "speech_stopped"]
    assert len(starts) == len(stops) == len(wav.segments), events
    for (t0, t1), s, e in zip(wav.segments, starts, stops, strict=True):
        assert abs(s - t0) <= 0.1 and abs(e - t1) <= 0.1, (wav.segments, starts, stops)


def test_vad_state_is_per_session_and_survives_garbage(tmp_path):
    wav = make_speech_wav(tmp_path / "v.wav", [0.3, "Hello there.", 0.6])
    r = InputResampler()
    speech16 = r.to16(wav.pcm)
    talker, quiet = VoiceActivityDetector(), VoiceActivityDetector()
    got_talker, got_quiet = [], []
    for i in range(0, speech16.size, 320):  # interleaved, like two live sessions
        got_talker += talker.feed(speech16[i : i + 320])
        got_quiet += quiet.feed(np.zeros(320, np.float32))
    assert [e.kind for e in got_talker] == ["speech_started", "speech_stopped"]
    assert got_quiet == []
    garbage = np.array([np.nan, np.inf, -np.inf, 7.0, -7.0] * 400, np.float32)
    assert quiet.feed(garbage) is not None  # no exception, whatever it decides


def test_timeline_read_mute_truncate_release():
    tl = PlaybackTimeline()
    tl.append(np.arange(1, 1001, dtype=np.int16))
    tl.append(np.arange(1001, 2001, dtype=np.int16))
    assert tl.head == 2000
    assert list(tl.read(998, 4)) == [999, 1000, 1001, 1002]
    assert list(tl.read(1998, 4)) == [1999, 2000, 0, 0]  # past the head: silence
    tl.mute(1000, 1002)
    assert list(tl.read(998, 6)) == [999, 1000, 0, 0, 1003, 1004]
    assert tl.truncate(1500) == 500 and tl.head == 1500
    assert list(tl.read(1498, 4)) == [1499, 1500, 0, 0]
    tl.release_before(1200)
    assert tl.base == 1000  # whole chunks are released


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


def test_playback_events_in_order_and_interrupt():
    sent = []
    tracker = PlaybackTracker(lambda m: sent.append(json.loads(m)))
    tracker.speech_started(RATE)
    tracker.speech_stopped(2 * RATE)
    tracker.speech_started(3 * RATE)
    for pos in range(0, int(3.5 * RATE) + 960, 960):
        tracker.played(pos)
    assert tracker.interrupt() == 500
    kinds = [(m["type"], m.get("position_ms"), m.get("interrupted")) for m in sent]
    assert kinds == [
        ("playback_started", None, None),
        ("playback_finished", 1000, False),
        ("playback_started", None, None),
        ("playback_finished", 500, True),
    ]


@pytest.mark.parametrize("raw", ["nope", "[]", '{"type": "dance"}', b"\xff"])
def test_bad_data_channel_messages_are_refused(raw):
    with pytest.raises(BadRequest):
        parse_client_message(raw)


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


class ScriptedEngineSession:
    """Emits 12 frames per 12 frames of audio (with 4 frames of lookahead); each frame's
    pixels hold its engine index, so tests can see which frame lands where."""

    def __init__(self) -> None:
        self.audio = 0
        self.emitted = 0
        self.closed = False

    def push_audio(self, samples):
        self.audio += len(samples)

    def samples_needed(self):
        return max(0, (self.emitted + 16) * 640 - self.audio)

    def generate_ready(self):
        from pipeline.engine import FrameBatch

        out = []
        while self.audio >= (self.emitted + 16) * 640:
            values = np.arange(self.emitted, self.emitted + 12, dtype=np.uint8)
            out.append(
                FrameBatch(
                    self.emitted, np.broadcast_to(values[:, None, None, None], (12, 4, 4, 3)).copy()
                )
            )
            self.emitted += 12
        return out

    def close(self):
        self.closed = True


def scripted_worker(engine, frames, clock):
    """A generation worker around a scripted engine, with no stats or error callbacks."""
    import threading

    from pipeline.schedule import StreamStep
    from realtime.worker import GenerationWorker

    return GenerationWorker(
        lambda: engine,
        frames,
        clock,
        asyncio.get_running_loop(),
        lambda stats: None,
        lambda exc: None,
        "unit",
        step=StreamStep(1, audio_frames=28, first_frame=12, end_frame=24),
        engine_lock=threading.Lock(),
    )


async def test_worker_rebase_retimes_frames_after_an_interrupt():
    engine = ScriptedEngineSession()
    frames, clock = FrameQueue(lead_frames=200, capacity=400), PlayoutClock()
    worker = scripted_worker(engine, frames, clock)
    worker.start()
    try:
        worker.push(np.zeros(40 * 640 + 100, np.float32))  # 40 frames and a bit
        await asyncio.sleep(0.3)
        assert worker.generated == 36 and worker.next_index() == 36
        frames.truncate(10)  # what PeerSession.interrupt does: keep 0..9
        new_audio = worker.rebase(10)
        # The engine was given exactly what its steps needed, audio up to frame 40 (the
        # partial frame still waited in the worker and is flushed): its frames 36..39 are
        # shown muted from 10 on; new audio starts at timeline frame 10 + 40 - 36 = 14.
        assert new_audio == 14 and worker.timeline_pos == 14 * 640
        worker.push(np.zeros(30 * 640, np.float32))
        await asyncio.sleep(0.3)
        queued = list(frames._frames)
        indices = [i for i, _ in queued]
        assert indices == list(range(len(indices))) and len(indices) >= 30
        shown = {i: int(f[0, 0, 0]) for i, f in queued}
        assert shown[9] == 9 and shown[10] == 36 and shown[11] == 37  # re-timed, no gap
    finally:
        worker.stop()
        assert await worker.wait_exited(5)
    assert engine.closed


async def test_worker_skips_stale_backlog_but_keeps_sync():
    engine = ScriptedEngineSession()
    frames, clock = FrameQueue(lead_frames=200, capacity=400), PlayoutClock()
    clock.start(time.monotonic() - 4.0)  # playout is already at frame 100
    worker = scripted_worker(engine, frames, clock)
    worker.push(np.zeros(130 * 640, np.float32))  # a backlog: frames 0..99 are already due
    worker.start()
    try:
        await asyncio.sleep(0.3)
    finally:
        worker.stop()
        await worker.wait_exited(5)
    queued = list(frames._frames)
    assert worker.skipped_frames_total >= 100 and queued, worker.skipped_frames_total
    offset = worker.skipped_frames_total
    for index, frame in queued:  # frame at timeline index i was made from audio frame i
        assert index >= 100 and int(frame[0, 0, 0]) == index - offset


def test_loading_the_vad_leaves_torch_threads_alone():
    """silero-vad's import pins torch to one thread; the engine shares the process."""
    import subprocess
    import sys

    code = (
        "import torch; torch.set_num_threads(2); import realtime.server, realtime.vad; "
        "print(torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"
