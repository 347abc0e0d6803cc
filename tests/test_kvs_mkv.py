"""KVS fragments as PyAV and our cluster writer make them, checked with our EBML reader
and, independently, by decoding with PyAV (FFmpeg's own Matroska demuxer)."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from support.kvs import gradient_frame, sine_pcm

from realtime.kvs import ebml
from realtime.kvs.errors import KvsConfigError
from realtime.kvs.metrics import KvsStats
from realtime.kvs.mkv import EncoderSettings, MkvFragmentWriter, annexb_to_avcc
from realtime.kvs.options import KvsOptions, StreamNamer
from realtime.kvs.timeline import MirrorTimeline, to_planar_float

FPS = 25
SPF = 48_000 // FPS


def make_writer(fragment_frames: int = 50, channels: int = 1) -> MkvFragmentWriter:
    return MkvFragmentWriter(EncoderSettings(64, 64, FPS, fragment_frames, audio_channels=channels))


def encode(frames: int, fragment_frames: int = 50) -> tuple[MkvFragmentWriter, list]:
    writer = make_writer(fragment_frames)
    fragments = []
    for n in range(frames):
        fragments += writer.add_video(gradient_frame(n), n)
        tone = to_planar_float(sine_pcm(n * SPF, SPF), 1)
        fragments += writer.add_audio(tone)
    fragments += writer.finish()
    writer.close()
    return writer, fragments


def decode(data: bytes) -> tuple[int, float, list[bool]]:
    """(video frames, audio seconds, key flags of video packets) from an MKV in memory."""
    with av.open(io.BytesIO(data), format="matroska") as box:
        keys = [p.is_keyframe for p in box.demux(video=0) if p.size]
    with av.open(io.BytesIO(data), format="matroska") as box:
        frames = sum(1 for _ in box.decode(video=0))
    with av.open(io.BytesIO(data), format="matroska") as box:
        samples = sum(f.samples for f in box.decode(audio=0))
    return frames, samples / 48_000, keys


def test_each_fragment_is_one_cluster_opening_on_a_key_frame_with_both_tracks():
    writer, fragments = encode(frames=260)  # 10.4 s: five 2-s fragments and a short one
    assert [f.timecode_ms for f in fragments] == [0, 2000, 4000, 6000, 8000, 10000]
    assert [f.video_frames for f in fragments] == [50, 50, 50, 50, 50, 10]
    for fragment in fragments:
        info = ebml.parse_cluster(fragment.data)
        assert info.timecode == fragment.timecode_ms
        assert info.starts_with_keyframe_on == 1, "the first block must be a video key frame"
        assert info.tracks == {1, 2}
        video = [b for b in info.blocks if b.track == 1]
        assert [b.keyframe for b in video] == [True] + [False] * (len(video) - 1)
        times = [info.timecode + b.relative_timecode for b in info.blocks]
        assert times == sorted(times)
        assert info.timecode <= min(times) and max(times) < info.timecode + 2000
    header = writer.header
    assert header.tracks == {1: "V_MPEG4/ISO/AVC", 2: "A_AAC"}
    assert header.codec_private[1][0] == 1, "H.264 codec private data must be AVCC (avcC)"
    assert header.codec_private[2][:2] == bytes([0x11, 0x88]), "AAC LC, 48 kHz, mono"


def test_the_stream_and_every_fragment_alone_decode_with_pyav():
    writer, fragments = encode(frames=130)
    frames, seconds, keys = decode(writer.header.data + b"".join(f.data for f in fragments))
    assert frames == 130
    assert seconds == pytest.approx(130 / FPS, abs=0.05)
    assert sum(keys) == 3
    for fragment in fragments:  # what a KVS consumer gets for one fragment
        frames, _, keys = decode(writer.header.data + fragment.data)
        assert frames == fragment.video_frames and keys[0]


def test_short_fragments_still_carry_both_tracks():
    _, fragments = encode(frames=30, fragment_frames=5)  # 200 ms: the 5-per-second limit
    assert len(fragments) == 6
    for fragment in fragments:
        assert ebml.parse_cluster(fragment.data).tracks == {1, 2}


def test_annexb_to_avcc_length_prefixes_every_nal():
    annexb = b"\x00\x00\x00\x01\x67\x64\x0a" + b"\x00\x00\x01\x68\xee" + b"\x00\x00\x01\x65\x88\x80"
    assert annexb_to_avcc(annexb) == (
        b"\x00\x00\x00\x03\x67\x64\x0a"
        + b"\x00\x00\x00\x02\x68\xee"
        + b"\x00\x00\x00\x03\x65\x88\x80"
    )


def test_splitter_reassembles_header_and_clusters_from_any_chunking():
    writer, fragments = encode(frames=120)
    body = writer.header.data + b"".join(f.data for f in fragments)
    splitter = ebml.StreamSplitter()
    items = []
    rng = np.random.default_rng(0)
    pos = 0
    while pos < len(body):
        step = int(rng.integers(1, 5000))
        items += list(splitter.feed(body[pos : pos + step]))
        pos += step
    assert isinstance(items[0], ebml.SegmentHeader) and items[0].data == writer.header.data
    assert items[1:] == [f.data for f in fragments]


def test_splitter_rejects_what_is_not_mkv():
    with pytest.raises(ebml.EbmlError):
        list(ebml.StreamSplitter().feed(b"\x1f\x43\xb6\x75\x81\x00" + b"junk" * 10))


class TestTimeline:
    def make(self, fill_after_s: float = 1.0) -> tuple[MirrorTimeline, KvsStats, list]:
        stats = KvsStats()
        timeline = MirrorTimeline(make_writer(fragment_frames=25), stats, fill_after_s, "t")
        return timeline, stats, []

    def test_gaps_are_filled_and_late_input_dropped(self):
        timeline, stats, out = self.make()
        for n in [0, 1, 2, 5, 6, 4, 7]:  # 3 and 4 missing, then 4 arrives late
            out += timeline.video(gradient_frame(n), n, put_at=0.0)
        assert stats.filled_frames == 2 and stats.late_dropped == 1
        out += timeline.audio(sine_pcm(0, 8 * SPF), 0, put_at=0.0)
        out += timeline.finish()
        assert sum(f.video_frames for f in out) == 8

    def test_session_counters_restarting_are_reanchored_in_sync(self):
        timeline, stats, out = self.make()
        for n in range(100):
            out += timeline.video(gradient_frame(n), n, put_at=0.0)
            out += timeline.audio(sine_pcm(n * SPF, SPF), n * SPF, put_at=0.0)
        for n in range(50):  # the session starts counting from 0 again
            out += timeline.video(gradient_frame(n), n, put_at=0.0)
            out += timeline.audio(sine_pcm(n * SPF, SPF), n * SPF, put_at=0.0)
        out += timeline.finish()
        assert stats.reanchors == 1 and stats.late_dropped == 0
        assert [f.video_frames for f in out] == [25] * 6

    def test_pauses_are_filled_with_the_last_frame_and_silence(self):
        timeline, stats, out = self.make(fill_after_s=0.5)
        for n in range(10):
            out += timeline.video(gradient_frame(n), n, put_at=100.0)
            out += timeline.audio(sine_pcm(n * SPF, SPF), n * SPF, put_at=100.0)
        out += timeline.fill(now=100.0 + 0.5 + 3.0)  # 3 s later, nothing came
        assert stats.filled_frames == 75 - 10
        assert [f.video_frames for f in out] == [25, 25]  # the third waits for its audio tail
        out += timeline.finish()
        assert sum(f.video_frames for f in out) == 75


def test_options_reject_what_kvs_would():
    KvsOptions(stream="ok", fragment_s=2.0).validate(FPS)
    with pytest.raises(KvsConfigError, match="5 fragments per second"):
        KvsOptions(stream="ok", fragment_s=0.12).validate(FPS)
    with pytest.raises(KvsConfigError, match="whole number"):
        KvsOptions(stream="ok", fragment_s=1.01).validate(FPS)
    with pytest.raises(KvsConfigError, match="at most 10 s"):
        KvsOptions(stream="ok", fragment_s=12).validate(FPS)
    with pytest.raises(KvsConfigError, match="invalid KVS stream name"):
        KvsOptions(stream="no spaces").validate(FPS)


def test_stream_names_one_per_session():
    namer = StreamNamer("show")
    assert [namer.next_name(), namer.next_name(), namer.next_name("guest"), namer.next_name()] == [
        "show",
        "show-2",
        "guest",
        "show-3",
    ]
    with pytest.raises(KvsConfigError):
        namer.next_name("bad/name")
