"""Just enough EBML (the binary format under Matroska) to cut a live MKV stream into fragments.

KVS maps each MKV Cluster to one fragment, so the mirror must know exactly where the
header ends and each Cluster begins and ends. FFmpeg writes the bytes; this module reads
them back incrementally: `StreamSplitter` is fed arbitrary byte chunks and hands out the
segment header once, then every complete Cluster. `parse_cluster` lists a Cluster's blocks
(track, timecode, key flag) so callers can check a fragment before it leaves the process.

Format reminder: every element is ID (1-4 bytes, marker bits kept) + size (1-8 bytes,
marker bit removed; all ones means "unknown size") + payload.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

# Element IDs (marker bits included, as written in the file).
EBML_HEADER = 0x1A45DFA3
SEGMENT = 0x18538067
SEEK_HEAD = 0x114D9B74
INFO = 0x1549A966
TIMECODE_SCALE = 0x2AD7B1
DURATION = 0x4489
TRACKS = 0x1654AE6B
TRACK_ENTRY = 0xAE
TRACK_NUMBER = 0xD7
TRACK_TYPE = 0x83
CODEC_ID = 0x86
CODEC_PRIVATE = 0x63A2
CODEC_DELAY = 0x56AA
CLUSTER = 0x1F43B675
CLUSTER_TIMECODE = 0xE7
SIMPLE_BLOCK = 0xA3
BLOCK_GROUP = 0xA0
BLOCK = 0xA1
REFERENCE_BLOCK = 0xFB
CUES = 0x1C53BB6B
TAGS = 0x1254C367
VOID = 0xEC
CRC32 = 0xBF

UNKNOWN_SIZE = -1
SEGMENT_UNKNOWN_SIZE = b"\x01\xff\xff\xff\xff\xff\xff\xff"


class EbmlError(ValueError):
    """The bytes are not the EBML/Matroska structure this module expects."""


def read_id(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int] | None:
    """(element id, bytes used) at `pos`, or None when `buf` ends too early."""
    if pos >= len(buf):
        return None
    first = buf[pos]
    length = _vint_length(first, max_len=4)
    if pos + length > len(buf):
        return None
    return int.from_bytes(buf[pos : pos + length], "big"), length


def read_size(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int] | None:
    """(payload size or UNKNOWN_SIZE, bytes used) at `pos`, or None when `buf` ends too early."""
    if pos >= len(buf):
        return None
    first = buf[pos]
    length = _vint_length(first, max_len=8)
    if pos + length > len(buf):
        return None
    value = first & (0xFF >> length)
    all_ones = value == (0xFF >> length)
    for byte in buf[pos + 1 : pos + length]:
        value = (value << 8) | byte
        all_ones = all_ones and byte == 0xFF
    return (UNKNOWN_SIZE if all_ones else value), length


def _vint_length(first: int, max_len: int) -> int:
    for length in range(1, max_len + 1):
        if first & (0x80 >> (length - 1)):
            return length
    raise EbmlError(f"invalid EBML variable-length integer starting with byte 0x{first:02x}")


def encode_size(size: int) -> bytes:
    """Shortest EBML size field for a known `size`."""
    for length in range(1, 9):
        if size < (1 << (7 * length)) - 1:
            return ((1 << (7 * length)) | size).to_bytes(length, "big")
    raise EbmlError(f"element size {size} does not fit in 8 bytes")


def encode_element(element_id: int, payload: bytes) -> bytes:
    id_len = (element_id.bit_length() + 7) // 8
    return element_id.to_bytes(id_len, "big") + encode_size(len(payload)) + payload


def iter_children(payload: bytes | memoryview) -> Iterator[tuple[int, memoryview]]:
    """(id, payload) of each child of a complete master element's payload."""
    view = memoryview(payload)
    pos = 0
    while pos < len(view):
        header = _element_header(view, pos)
        if header is None:
            raise EbmlError(f"truncated element at offset {pos}")
        element_id, header_len, size = header
        if size == UNKNOWN_SIZE:
            raise EbmlError(f"element 0x{element_id:x} of unknown size inside a sized master")
        start = pos + header_len
        if start + size > len(view):
            raise EbmlError(f"element 0x{element_id:x} runs past its parent")
        yield element_id, view[start : start + size]
        pos = start + size


def _element_header(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int, int] | None:
    got_id = read_id(buf, pos)
    if got_id is None:
        return None
    element_id, id_len = got_id
    got_size = read_size(buf, pos + id_len)
    if got_size is None:
        return None
    size, size_len = got_size
    return element_id, id_len + size_len, size


def read_uint(payload: bytes | bytearray | memoryview) -> int:
    return int.from_bytes(payload, "big") if len(payload) else 0


@dataclass(frozen=True)
class Block:
    """One (Simple)Block of a cluster: which track, when (relative to the cluster), key or not."""

    track: int
    relative_timecode: int
    keyframe: bool
    size: int


@dataclass(frozen=True)
class ClusterInfo:
    timecode: int
    blocks: list[Block] = field(default_factory=list)

    @property
    def tracks(self) -> set[int]:
        return {block.track for block in self.blocks}

    @property
    def starts_with_keyframe_on(self) -> int | None:
        """Track number of the first block when it is a key frame, else None."""
        if not self.blocks or not self.blocks[0].keyframe:
            return None
        return self.blocks[0].track

    @property
    def last_timecode(self) -> int:
        return self.timecode + max((b.relative_timecode for b in self.blocks), default=0)


def parse_cluster(element: bytes) -> ClusterInfo:
    """Read a complete Cluster element (ID and size included)."""
    header = _element_header(element, 0)
    if header is None or header[0] != CLUSTER:
        raise EbmlError("not a Cluster element")
    _, header_len, size = header
    payload = memoryview(element)[header_len:] if size == UNKNOWN_SIZE else None
    if payload is None:
        payload = memoryview(element)[header_len : header_len + size]
    timecode: int | None = None
    blocks: list[Block] = []
    for child_id, child in iter_children(payload):
        if child_id == CLUSTER_TIMECODE:
            timecode = read_uint(child)
        elif child_id == SIMPLE_BLOCK:
            blocks.append(_parse_block(child, simple=True))
        elif child_id == BLOCK_GROUP:
            blocks.append(_parse_block_group(child))
    if timecode is None:
        raise EbmlError("Cluster without a Timecode element")
    return ClusterInfo(timecode=timecode, blocks=blocks)


def _parse_block(payload: memoryview, simple: bool, keyframe: bool = False) -> Block:
    got = read_size(payload, 0)  # the track number is coded like a size
    if got is None or len(payload) < got[1] + 3:
        raise EbmlError("truncated block header")
    track, used = got
    relative = int.from_bytes(payload[used : used + 2], "big", signed=True)
    flags = payload[used + 2]
    if simple:
        keyframe = bool(flags & 0x80)
    return Block(track=track, relative_timecode=relative, keyframe=keyframe, size=len(payload))


def _parse_block_group(payload: memoryview) -> Block:
    block: memoryview | None = None
    has_reference = False
    for child_id, child in iter_children(payload):
        if child_id == BLOCK:
            block = child
        elif child_id == REFERENCE_BLOCK:
            has_reference = True
    if block is None:
        raise EbmlError("BlockGroup without a Block")
    # In a BlockGroup a key frame is a block that references no other block.
    return _parse_block(block, simple=False, keyframe=not has_reference)


@dataclass(frozen=True)
class SegmentHeader:
    """The bytes a PutMedia body starts with: EBML header + Segment (unknown size) + Info + Tracks."""

    data: bytes
    timecode_scale_ns: int
    tracks: dict[int, str]  # track number -> codec id
    codec_private: dict[int, bytes]


def build_header(ebml_header: bytes, info: bytes, tracks: bytes) -> SegmentHeader:
    """PutMedia header from a muxer's EBML header, Info and Tracks elements.

    Duration and CRC-32 go (a live segment has no length); each track's CodecDelay goes
    too, because the mirror writes audio blocks at their presentation time (the AAC
    priming packet is dropped instead of signalled).
    """
    info = _strip_children(info, {DURATION, CRC32})
    tracks = _rewrite_track_entries(tracks, drop={CODEC_DELAY, CRC32})
    scale, codec_ids, privates = _describe(info, tracks)
    data = ebml_header + SEGMENT.to_bytes(4, "big") + SEGMENT_UNKNOWN_SIZE + info + tracks
    return SegmentHeader(
        data=data, timecode_scale_ns=scale, tracks=codec_ids, codec_private=privates
    )


def header_from_muxer_output(data: bytes) -> SegmentHeader:
    """Cut the header a Matroska muxer wrote (before any Cluster) into a PutMedia header."""
    view = memoryview(data)
    pos = 0
    found: dict[int, bytes] = {}
    while pos < len(view):
        header = _element_header(view, pos)
        if header is None:
            raise EbmlError(f"muxer header truncated at offset {pos}")
        element_id, header_len, size = header
        if element_id == SEGMENT:
            pos += header_len  # step into the segment; its children are level 1
            continue
        if size == UNKNOWN_SIZE or pos + header_len + size > len(view):
            raise EbmlError(f"element 0x{element_id:x} at offset {pos} is incomplete")
        found.setdefault(element_id, bytes(view[pos : pos + header_len + size]))
        pos += header_len + size
    missing = [
        name
        for name, key in (("EBML", EBML_HEADER), ("Info", INFO), ("Tracks", TRACKS))
        if key not in found
    ]
    if missing:
        raise EbmlError(f"muxer header lacks {', '.join(missing)}")
    return build_header(found[EBML_HEADER], found[INFO], found[TRACKS])


class StreamSplitter:
    """Incremental reader of one MKV segment: yields the header once, then whole Clusters.

    Level-1 elements other than Info, Tracks and Cluster (SeekHead, Void, Tags, Cues) are
    dropped: a live PutMedia body needs none of them, and KVS would read Tags between
    clusters as fragment metadata.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._ebml_header: bytes | None = None
        self._in_segment = False
        self._level1: list[tuple[int, bytes]] = []
        self.header: SegmentHeader | None = None

    def feed(self, data: bytes) -> Iterator[SegmentHeader | bytes]:
        """Add bytes; yield the SegmentHeader (once) and each complete Cluster element."""
        self._buf += data
        pos = 0
        while True:
            header = _element_header(self._buf, pos)
            if header is None:
                break
            element_id, header_len, size = header
            if not self._in_segment and self._ebml_header is None:
                if element_id != EBML_HEADER:
                    raise EbmlError(f"stream does not start with an EBML header (0x{element_id:x})")
            if element_id == SEGMENT:
                if size != UNKNOWN_SIZE:
                    raise EbmlError("live MKV needs a Segment of unknown size")
                self._in_segment = True
                pos += header_len
                continue
            if size == UNKNOWN_SIZE:
                raise EbmlError(
                    f"level-1 element 0x{element_id:x} of unknown size is not supported"
                )
            end = pos + header_len + size
            if end > len(self._buf):
                break
            element = bytes(self._buf[pos:end])
            pos = end
            yield from self._take(element_id, element)
        del self._buf[:pos]

    def pending_cluster_timecode(self) -> int | None:
        """Timecode of the Cluster whose first bytes are buffered but which is not complete."""
        header = _element_header(self._buf, 0)
        if header is None or header[0] != CLUSTER:
            return None
        child = _element_header(self._buf, header[1])
        if child is None or child[0] != CLUSTER_TIMECODE:
            return None
        start = header[1] + child[1]
        if start + child[2] > len(self._buf):
            return None
        return read_uint(self._buf[start : start + child[2]])

    def _take(self, element_id: int, element: bytes) -> Iterator[SegmentHeader | bytes]:
        if element_id == EBML_HEADER:
            self._ebml_header = element
        elif element_id in (INFO, TRACKS):
            self._level1.append((element_id, element))
        elif element_id == CLUSTER:
            if self.header is None:
                self.header = self._build_header()
                yield self.header
            yield element

    def _build_header(self) -> SegmentHeader:
        if self._ebml_header is None:
            raise EbmlError("Cluster before the EBML header")
        ids = [element_id for element_id, _ in self._level1]
        if ids.count(INFO) != 1 or ids.count(TRACKS) != 1:
            raise EbmlError(f"expected one Info and one Tracks before the first Cluster, got {ids}")
        info = dict(self._level1)[INFO]
        tracks = dict(self._level1)[TRACKS]
        info = _strip_children(info, {DURATION, CRC32})
        scale, codec_ids, privates = _describe(info, tracks)
        data = self._ebml_header + SEGMENT.to_bytes(4, "big") + SEGMENT_UNKNOWN_SIZE + info + tracks
        return SegmentHeader(
            data=data, timecode_scale_ns=scale, tracks=codec_ids, codec_private=privates
        )


def _strip_children(element: bytes, drop: set[int]) -> bytes:
    element_id, header_len, size = _element_header(element, 0)  # type: ignore[misc]
    payload = memoryview(element)[header_len : header_len + size]
    kept = b"".join(
        encode_element(child_id, bytes(child))
        for child_id, child in iter_children(payload)
        if child_id not in drop
    )
    return encode_element(element_id, kept)


def _rewrite_track_entries(tracks: bytes, drop: set[int]) -> bytes:
    _, header_len, size = _element_header(tracks, 0)  # type: ignore[misc]
    entries = []
    for child_id, child in iter_children(memoryview(tracks)[header_len : header_len + size]):
        element = encode_element(child_id, bytes(child))
        entries.append(_strip_children(element, drop) if child_id == TRACK_ENTRY else element)
    return encode_element(TRACKS, b"".join(entries))


def _describe(info: bytes, tracks: bytes) -> tuple[int, dict[int, str], dict[int, bytes]]:
    scale = 1_000_000
    for child_id, child in iter_children(memoryview(info)[_element_header(info, 0)[1] :]):  # type: ignore[index]
        if child_id == TIMECODE_SCALE:
            scale = read_uint(child)
    codec_ids: dict[int, str] = {}
    privates: dict[int, bytes] = {}
    for child_id, entry in iter_children(memoryview(tracks)[_element_header(tracks, 0)[1] :]):  # type: ignore[index]
        if child_id != TRACK_ENTRY:
            continue
        number, codec, private = 0, "", b""
        for field_id, value in iter_children(entry):
            if field_id == TRACK_NUMBER:
                number = read_uint(value)
            elif field_id == CODEC_ID:
                codec = bytes(value).decode("ascii", "replace").rstrip("\0")
            elif field_id == CODEC_PRIVATE:
                private = bytes(value)
        codec_ids[number] = codec
        privates[number] = private
    return scale, codec_ids, privates


def write_cluster(timecode: int, blocks: list[tuple[int, int, bool, bytes]]) -> bytes:
    """One Cluster of SimpleBlocks; `blocks` are (track, timecode, keyframe, data), in order.

    Block timecodes are absolute (same scale as `timecode`) and must fit the signed 16-bit
    offset from the cluster's timecode.
    """
    parts = [encode_element(CLUSTER_TIMECODE, _uint_bytes(timecode))]
    for track, block_timecode, keyframe, data in blocks:
        relative = block_timecode - timecode
        if not -32768 <= relative <= 32767:
            raise EbmlError(f"block at {block_timecode} is too far from cluster {timecode}")
        head = encode_size(track) + relative.to_bytes(2, "big", signed=True)
        head += bytes([0x80 if keyframe else 0x00])
        parts.append(encode_element(SIMPLE_BLOCK, head + data))
    return encode_element(CLUSTER, b"".join(parts))


def _uint_bytes(value: int) -> bytes:
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
