"""Encode a session's frames and audio into KVS fragments: one MKV Cluster per fragment.

PyAV does the media work: libx264 (no B-frames, an IDR at every fragment start) and AAC
at 48 kHz, and FFmpeg's Matroska muxer writes the segment header (EBML header, Info,
Tracks with AVCC and AudioSpecificConfig codec private data). The clusters are cut here,
not by the muxer, because the muxer decides cluster boundaries by *block* time while it
interleaves by *decode* time, and the two differ for AAC by its 1024-sample codec delay:
left to FFmpeg, the audio packet just before each key frame opens the next cluster, so
fragments would start with audio. Writing the clusters ourselves makes each one exactly
[k*F, (k+1)*F): a key frame first, then every video and audio block of that span in time
order, with timecodes that never go back.

Runs on the mirror's worker thread only: every call here is blocking CPU work.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from pipeline.clock import OUTPUT_RATE
from realtime.kvs import ebml

AAC_FRAME = 1024  # samples per AAC packet
VIDEO_TRACK = 1  # KVS plays track 1 as H.264 video and track 2 as AAC audio
AUDIO_TRACK = 2


@dataclass(frozen=True)
class EncoderSettings:
    width: int
    height: int
    fps: int
    fragment_frames: int
    audio_channels: int = 1
    video_bitrate: int = 2_000_000
    audio_bitrate: int = 128_000
    x264_preset: str = "veryfast"

    @property
    def fragment_ms(self) -> int:
        return self.fragment_frames * 1000 // self.fps


@dataclass(frozen=True)
class MkvFragment:
    """One KVS fragment: a complete Cluster element and where it sits on the timeline."""

    index: int
    timecode_ms: int  # cluster timecode, relative to the producer start timestamp
    duration_ms: int
    data: bytes
    video_frames: int
    audio_packets: int


class MkvFragmentWriter:
    """Frames and PCM in (contiguous, in order), finished fragments out.

    `add_video` takes frame n of the mirror timeline (n = 0, 1, 2, ...); `add_audio` takes
    the next samples of the audio timeline (sample 0 lines up with frame 0). A fragment is
    returned as soon as both tracks have passed its end.
    """

    def __init__(self, settings: EncoderSettings) -> None:
        if (1000 * settings.fragment_frames) % settings.fps:
            raise ValueError("fragment_frames * 1000 / fps must be a whole number of ms")
        self.settings = settings
        self._sink = _HeaderSink()
        self._container = av.open(
            self._sink,
            "w",
            format="matroska",
            options={"live": "1", "write_crc32": "0"},
            # flush_packets: the header must reach the sink now, not when a buffer fills.
            container_options={"fflags": "+flush_packets+bitexact"},
        )
        self._video = self._add_video_stream(settings)
        self._audio = self._add_audio_stream(settings)
        self._container.start_encoding()
        self.header = ebml.header_from_muxer_output(bytes(self._sink.data))
        self._next_frame = 0
        self._next_sample = 0
        self._pcm = np.zeros((settings.audio_channels, 0), np.float32)
        self._audio_end_ms = 0  # presentation time reached by encoded audio packets
        self._fragment = 0
        self._video_blocks: list[tuple[int, bool, bytes]] = []
        self._audio_blocks: list[tuple[int, bytes]] = []
        self._video_done_ms = 0

    def _add_video_stream(self, s: EncoderSettings) -> av.VideoStream:
        gop = str(s.fragment_frames)
        stream = self._container.add_stream(
            "libx264",
            rate=s.fps,
            options={
                "preset": s.x264_preset,
                "tune": "zerolatency",  # no lookahead: a packet per frame, right away
                "bframes": "0",
                "g": gop,
                "keyint_min": gop,
                "sc_threshold": "0",  # no scene-cut key frames inside a fragment
                "forced-idr": "1",  # a forced key frame is an IDR, decodable on its own
                "maxrate": str(s.video_bitrate),
                "bufsize": str(2 * s.video_bitrate),
            },
        )
        stream.width, stream.height = s.width, s.height
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = s.video_bitrate
        stream.codec_context.time_base = Fraction(1, s.fps)
        return stream

    def _add_audio_stream(self, s: EncoderSettings) -> av.AudioStream:
        layout = "mono" if s.audio_channels == 1 else "stereo"
        stream = self._container.add_stream("aac", rate=OUTPUT_RATE, layout=layout)
        stream.bit_rate = s.audio_bitrate
        return stream

    @property
    def next_frame(self) -> int:
        return self._next_frame

    def add_video(self, rgb: np.ndarray, frame_index: int) -> list[MkvFragment]:
        assert frame_index == self._next_frame, (frame_index, self._next_frame)
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = frame_index
        frame.time_base = Fraction(1, self.settings.fps)
        if frame_index % self.settings.fragment_frames == 0:
            frame.pict_type = av.video.frame.PictureType.I
        for packet in self._video.encode(frame):
            self._take_video(packet)
        self._next_frame += 1
        self._video_done_ms = self._frame_ms(self._next_frame)
        return self._emit_ready()

    def add_audio(self, pcm: np.ndarray) -> list[MkvFragment]:
        """Append float32 samples shaped (channels, n) in [-1, 1] to the audio timeline."""
        assert pcm.shape[0] == self.settings.audio_channels, pcm.shape
        self._pcm = np.concatenate([self._pcm, pcm.astype(np.float32, copy=False)], axis=1)
        while self._pcm.shape[1] >= AAC_FRAME:
            chunk, self._pcm = self._pcm[:, :AAC_FRAME], self._pcm[:, AAC_FRAME:]
            self._encode_audio(np.ascontiguousarray(chunk))
        return self._emit_ready()

    def finish(self) -> list[MkvFragment]:
        """Flush both encoders and return every remaining fragment (the last may be short)."""
        if self._pcm.shape[1]:
            pad = AAC_FRAME - self._pcm.shape[1]
            self._pcm = np.pad(self._pcm, ((0, 0), (0, pad)))
            self._encode_audio(np.ascontiguousarray(self._pcm))
            self._pcm = self._pcm[:, :0]
        for packet in self._video.encode(None):
            self._take_video(packet)
        for packet in self._audio.encode(None):
            self._take_audio(packet)
        fragments = self._emit_ready()
        if self._video_blocks:
            fragments.append(self._emit(end_ms=None))
        return fragments

    def close(self) -> None:
        try:
            self._container.close()
        except av.error.FFmpegError:
            pass  # the trailer of an unused muxer; nothing of ours is lost

    def _encode_audio(self, chunk: np.ndarray) -> None:
        layout = "mono" if self.settings.audio_channels == 1 else "stereo"
        frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
        frame.sample_rate = OUTPUT_RATE
        frame.pts = self._next_sample
        frame.time_base = Fraction(1, OUTPUT_RATE)
        self._next_sample += chunk.shape[1]
        for packet in self._audio.encode(frame):
            self._take_audio(packet)

    def _take_video(self, packet: av.Packet) -> None:
        assert packet.pts is not None, "the encoder stamps every video packet"
        ms = self._frame_ms(int(packet.pts))
        self._video_blocks.append((ms, bool(packet.is_keyframe), annexb_to_avcc(bytes(packet))))

    def _take_audio(self, packet: av.Packet) -> None:
        if packet.pts is None or packet.pts < 0:
            return  # the encoder's priming packet: it precedes sample 0 of the timeline
        ms = int(packet.pts) * 1000 // OUTPUT_RATE
        self._audio_blocks.append((ms, bytes(packet)))
        self._audio_end_ms = (int(packet.pts) + AAC_FRAME) * 1000 // OUTPUT_RATE

    def _frame_ms(self, frame_index: int) -> int:
        return frame_index * 1000 // self.settings.fps

    def _emit_ready(self) -> list[MkvFragment]:
        fragments: list[MkvFragment] = []
        while True:
            end_ms = (self._fragment + 1) * self.settings.fragment_ms
            audio_past_end = any(ms >= end_ms for ms, _ in self._audio_blocks)
            if self._video_done_ms < end_ms or not audio_past_end:
                return fragments
            fragments.append(self._emit(end_ms))

    def _emit(self, end_ms: int | None) -> MkvFragment:
        start_ms = self._fragment * self.settings.fragment_ms
        video = [b for b in self._video_blocks if end_ms is None or b[0] < end_ms]
        audio = [b for b in self._audio_blocks if end_ms is None or b[0] < end_ms]
        self._video_blocks = self._video_blocks[len(video) :]
        self._audio_blocks = self._audio_blocks[len(audio) :]
        assert video and video[0][0] == start_ms and video[0][1], (
            "fragment must open on a key frame"
        )
        # Video first on equal timecodes, so the key frame is the cluster's first block.
        blocks = [(ms, 0, VIDEO_TRACK, key, data) for ms, key, data in video]
        blocks += [(ms, 1, AUDIO_TRACK, True, data) for ms, data in audio]
        blocks.sort(key=lambda b: (b[0], b[1]))
        cluster = ebml.write_cluster(start_ms, [(t, ms, key, d) for ms, _, t, key, d in blocks])
        stop_ms = end_ms if end_ms is not None else self._video_done_ms
        fragment = MkvFragment(
            index=self._fragment,
            timecode_ms=start_ms,
            duration_ms=stop_ms - start_ms,
            data=cluster,
            video_frames=len(video),
            audio_packets=len(audio),
        )
        self._fragment += 1
        return fragment


def annexb_to_avcc(data: bytes) -> bytes:
    """H.264 Annex B (start codes) to the 4-byte length-prefixed NAL units Matroska stores."""
    if not data.startswith((b"\x00\x00\x01", b"\x00\x00\x00\x01")):
        return data  # already length-prefixed
    out = bytearray()
    for nal in _split_annexb(data):
        if nal:
            out += len(nal).to_bytes(4, "big") + nal
    return bytes(out)


def _split_annexb(data: bytes) -> list[bytes]:
    starts: list[tuple[int, int]] = []  # (start code offset, payload offset)
    i = 0
    while True:
        i = data.find(b"\x00\x00\x01", i)
        if i < 0:
            break
        code_at = i - 1 if i > 0 and data[i - 1] == 0 else i
        starts.append((code_at, i + 3))
        i += 3
    nals = []
    for n, (_, payload_at) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(data)
        nals.append(data[payload_at:end])
    return nals


class _HeaderSink:
    """Non-seekable file object for the muxer, so it writes a live (unknown-size) segment."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def seekable(self) -> bool:
        return False
