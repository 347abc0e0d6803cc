"""A local PutMedia endpoint that behaves like KVS's, for tests and for trying the mirror by hand.

It checks what KVS checks: the SigV4 Authorization header (recomputed with botocore from
known credentials), the x-amzn-* headers, and the MKV body, which it parses cluster by
cluster as it streams in (EBML header, one Segment, Tracks, then one fragment per
Cluster: a key frame first, frames of every track, timecodes never going back). It
answers with the real acknowledgement lines (BUFFERING, RECEIVED, PERSISTED, ERROR, IDLE)
and keeps the persisted fragments as the stream's timeline, keyed by producer timestamp,
so tests can look for gaps and duplicates. Faults can be injected: ERROR codes, HTTP
errors, and connections dropped in the middle of a fragment.

By hand:  python tests/support/kvs.py --port 8555 --out /tmp/kvs.mkv
then      AWS_ACCESS_KEY_ID=AKIDFAKE AWS_SECRET_ACCESS_KEY=fake ... facecast serve \\
          --kvs-stream demo --kvs-endpoint-url http://127.0.0.1:8555
(the control plane still needs AWS or a moto server: AWS_ENDPOINT_URL_KINESIS_VIDEO).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import re
import time
from dataclasses import dataclass, field

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import numpy as np
from aiohttp import web

from realtime.kvs import KvsOptions, ebml
from realtime.kvs.putmedia import ACK_ERRORS

REQUIRED_HEADERS = (
    "x-amzn-stream-name",
    "x-amzn-fragment-timecode-type",
    "x-amzn-producer-start-timestamp",
)
AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[^,]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)
MAX_FRAGMENT_MS = 10_000


@dataclass
class Fragment:
    """A fragment as the fake KVS saw it."""

    timecode: int
    producer_ms: int
    data: bytes
    info: ebml.ClusterInfo
    request: int
    arrived_at: float  # monotonic


@dataclass
class RequestLog:
    stream: str
    status: int
    auth_error: str | None = None
    fragments: int = 0
    end: str = ""


@dataclass
class _Faults:
    http_errors: list[tuple[int, str]] = field(default_factory=list)
    errors_at: dict[int, int] = field(default_factory=dict)  # timecode -> ErrorId
    disconnect_at: set[int] = field(default_factory=set)  # timecodes
    acks_first: set[int] = field(default_factory=set)  # of disconnect_at: acks go out first
    lose_persisted_ack_at: set[int] = field(default_factory=set)  # timecodes


class FakeKvsEndpoint:
    def __init__(
        self,
        access_key: str,
        secret_key: str,
        region: str,
        streams: set[str] | None = None,
        persist_delay_s: float = 0.0,
        idle_ack_s: float = 2.0,
        no_data_timeout_s: float = 30.0,
    ) -> None:
        self._credentials = botocore.credentials.Credentials(access_key, secret_key)
        self._region = region
        self._streams = streams
        self._persist_delay_s = persist_delay_s
        self._idle_ack_s = idle_ack_s
        self._no_data_timeout_s = no_data_timeout_s
        self._faults = _Faults()
        self._runner: web.AppRunner | None = None
        self._fragment_number = 91343852333181432392682062607743920146264
        self.url = ""
        self.requests: list[RequestLog] = []
        self.headers: dict[str, ebml.SegmentHeader] = {}  # stream -> first header seen
        self.timeline: dict[str, dict[int, Fragment]] = {}  # stream -> producer ms -> fragment
        self.duplicates: list[Fragment] = []
        self.received: list[Fragment] = []  # every complete cluster, persisted or not
        self.rejected: list[tuple[int, int]] = []  # (timecode, ErrorId) sent as ERROR acks

    # --- control -----------------------------------------------------------------------
    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/putMedia", self._put_media)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def fail_requests(self, status: int, count: int = 1, error_type: str = "") -> None:
        """Answer the next `count` requests with HTTP `status` (and x-amz-ErrorType)."""
        error_type = error_type or ("InternalFailure" if status >= 500 else "InvalidArgument")
        self._faults.http_errors += [(status, error_type)] * count

    def error_at(self, timecode: int, error_id: int) -> None:
        """Once: answer the fragment at `timecode` with ERROR `error_id` and end the response."""
        self._faults.errors_at[timecode] = error_id

    def disconnect_at(self, timecode: int, acks_first: bool = False) -> None:
        """Once: drop the connection while the fragment at `timecode` is arriving. With
        `acks_first`, every earlier fragment is persisted and acknowledged first (a drop
        after their acks); else those still persisting are cut off too."""
        self._faults.disconnect_at.add(timecode)
        if acks_first:
            self._faults.acks_first.add(timecode)

    def lose_persisted_ack_at(self, timecode: int) -> None:
        """Once: persist the fragment at `timecode`, then drop the connection before its
        PERSISTED ack is written (the ack lost in the network)."""
        self._faults.lose_persisted_ack_at.add(timecode)

    # --- results -----------------------------------------------------------------------
    def fragments(self, stream: str) -> list[Fragment]:
        """The persisted timeline of `stream`, in producer-time order."""
        timeline = self.timeline.get(stream, {})
        return [timeline[key] for key in sorted(timeline)]

    def mkv(self, stream: str) -> bytes:
        """What a GetMedia of the whole stream would give: header + every persisted cluster."""
        return self.headers[stream].data + b"".join(f.data for f in self.fragments(stream))

    # --- the request ---------------------------------------------------------------------
    async def _put_media(self, request: web.Request) -> web.StreamResponse:
        stream = request.headers.get("x-amzn-stream-name", "")
        log = RequestLog(stream=stream, status=200)
        self.requests.append(log)
        refusal = self._refuse(request, log)
        if refusal is not None:
            log.status = refusal.status
            return refusal
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        session = _Session(self, request, response, log, len(self.requests))
        await session.run()
        return response

    def _refuse(self, request: web.Request, log: RequestLog) -> web.Response | None:
        missing = [h for h in REQUIRED_HEADERS if h not in request.headers]
        if missing:
            return _error(400, "InvalidArgumentException", f"missing headers {missing}")
        if request.headers["x-amzn-fragment-timecode-type"] not in ("ABSOLUTE", "RELATIVE"):
            return _error(400, "InvalidArgumentException", "bad x-amzn-fragment-timecode-type")
        try:
            float(request.headers["x-amzn-producer-start-timestamp"])
        except ValueError:
            return _error(400, "InvalidArgumentException", "bad x-amzn-producer-start-timestamp")
        log.auth_error = self._check_signature(request)
        if log.auth_error is not None:
            return _error(403, "NotAuthorizedException", log.auth_error)
        if self._faults.http_errors:
            status, error_type = self._faults.http_errors.pop(0)
            return _error(status, error_type, "injected failure")
        if self._streams is not None and log.stream not in self._streams:
            return _error(404, "ResourceNotFoundException", f"stream {log.stream} not found")
        return None

    def _check_signature(self, request: web.Request) -> str | None:
        """None when the Authorization header is a valid SigV4 signature of this request."""
        match = AUTH.match(request.headers.get("Authorization", ""))
        if match is None:
            return "missing or malformed Authorization header"
        if match["key"] != self._credentials.access_key:
            return "unknown access key"
        if (match["region"], match["service"]) != (self._region, "kinesisvideo"):
            return f"wrong credential scope {match['region']}/{match['service']}"
        amz_date = request.headers.get("X-Amz-Date", "")
        if not amz_date.startswith(match["date"]):
            return "X-Amz-Date does not match the credential scope"
        signed = match["signed"].split(";")
        for name in ("host", "x-amz-date", *REQUIRED_HEADERS):
            if name not in signed:
                return f"header {name} is not signed"
        aws_request = botocore.awsrequest.AWSRequest(
            method=request.method,
            url=f"http://{request.host}{request.path}",
            headers={name: request.headers.get(name, "") for name in signed},
        )
        aws_request.context["timestamp"] = amz_date
        signer = botocore.auth.SigV4Auth(self._credentials, "kinesisvideo", self._region)
        if signer.signed_headers(signer.headers_to_sign(aws_request)) != match["signed"]:
            return "SignedHeaders list is not canonical"
        canonical = signer.canonical_request(aws_request)
        expected = signer.signature(signer.string_to_sign(aws_request, canonical), aws_request)
        if not hmac.compare_digest(expected, match["signature"]):
            return "signature mismatch"
        return None

    def _next_fragment_number(self) -> str:
        self._fragment_number += 1
        return str(self._fragment_number)


class _Session:
    """One PutMedia request: parse clusters as they arrive, acknowledge, persist."""

    def __init__(
        self,
        endpoint: FakeKvsEndpoint,
        request: web.Request,
        response: web.StreamResponse,
        log: RequestLog,
        number: int,
    ) -> None:
        self._kvs = endpoint
        self._request = request
        self._response = response
        self._log = log
        self._number = number
        self._stream = log.stream
        self._start_ms = round(float(request.headers["x-amzn-producer-start-timestamp"]) * 1000)
        self._relative = request.headers["x-amzn-fragment-timecode-type"] == "RELATIVE"
        self._splitter = ebml.StreamSplitter()
        self._write_lock = asyncio.Lock()
        self._last_timecode: int | None = None
        self._last_data_at = time.monotonic()
        self._persists: set[asyncio.Task] = set()
        self._announced: set[int] = set()

    async def run(self) -> None:
        idle = asyncio.create_task(self._idle_acks())
        try:
            self._log.end = await self._read_body()
            if self._log.end in ("eof", "error"):
                await asyncio.gather(*self._persists)  # a clean end: finish persisting
        except (ConnectionResetError, asyncio.CancelledError):
            self._log.end = "client gone"
        finally:
            idle.cancel()
            for task in self._persists:
                task.cancel()
        if self._log.end == "dropped":
            self._request.transport.close()  # type: ignore[union-attr]

    async def _read_body(self) -> str:
        content = self._request.content
        while True:
            try:
                chunk = await asyncio.wait_for(content.readany(), self._kvs._no_data_timeout_s)
            except asyncio.TimeoutError:
                return "no data timeout"
            if not chunk:
                return "eof"
            self._last_data_at = time.monotonic()
            outcome = await self._take(chunk)
            if outcome is not None:
                return outcome

    async def _take(self, chunk: bytes) -> str | None:
        try:
            items = list(self._splitter.feed(chunk))
        except ebml.EbmlError as exc:
            await self._ack_error(self._last_timecode or 0, 4006, note=str(exc))
            return "error"
        for item in items:
            if isinstance(item, ebml.SegmentHeader):
                if not self._header_ok(item):
                    await self._ack_error(0, 4006, note="bad tracks")
                    return "error"
                continue
            outcome = await self._fragment(item)
            if outcome is not None:
                return outcome
        await self._announce_partial()
        return None

    def _header_ok(self, header: ebml.SegmentHeader) -> bool:
        first = self._kvs.headers.setdefault(self._stream, header)
        return header.tracks == first.tracks and set(header.tracks) == {1, 2}

    async def _announce_partial(self) -> None:
        """BUFFERING as soon as a cluster's timecode is known (KVS: on its first bytes)."""
        pending = self._splitter.pending_cluster_timecode()
        if pending is not None and pending not in self._announced:
            self._announced.add(pending)
            if pending in self._kvs._faults.disconnect_at:
                return  # a dropped connection: the client sees nothing for this one
            await self._ack("BUFFERING", pending)

    async def _fragment(self, data: bytes) -> str | None:
        info = ebml.parse_cluster(data)
        faults = self._kvs._faults
        if info.timecode in faults.disconnect_at:
            faults.disconnect_at.discard(info.timecode)
            if info.timecode in faults.acks_first:
                faults.acks_first.discard(info.timecode)
                await self._settle_acks()
            return "dropped"  # as if the socket died with this cluster half sent
        fragment = Fragment(
            timecode=info.timecode,
            producer_ms=self._start_ms + info.timecode if self._relative else info.timecode,
            data=data,
            info=info,
            request=self._number,
            arrived_at=time.monotonic(),
        )
        self._kvs.received.append(fragment)
        if info.timecode not in self._announced:
            self._announced.add(info.timecode)
            await self._ack("BUFFERING", info.timecode)
        error_id = faults.errors_at.pop(info.timecode, None) or self._validate(info)
        if error_id:
            await self._ack_error(info.timecode, error_id)
            return "error"
        self._last_timecode = info.timecode
        self._log.fragments += 1
        await self._ack("RECEIVED", info.timecode)
        task = asyncio.create_task(self._persist(fragment))
        self._persists.add(task)
        task.add_done_callback(self._persists.discard)
        return None

    def _validate(self, info: ebml.ClusterInfo) -> int:
        tracks = set(self._kvs.headers[self._stream].tracks)
        if self._last_timecode is not None and info.timecode <= self._last_timecode:
            return 4004
        if not info.tracks <= tracks:
            return 4010
        if info.tracks != tracks:
            return 4011
        if info.last_timecode - info.timecode > MAX_FRAGMENT_MS:
            return 4002
        return 0

    async def _persist(self, fragment: Fragment) -> None:
        if self._kvs._persist_delay_s:
            await asyncio.sleep(self._kvs._persist_delay_s)
        timeline = self._kvs.timeline.setdefault(self._stream, {})
        if fragment.producer_ms in timeline:
            self._kvs.duplicates.append(fragment)
        else:  # the timeline keeps the first copy: what a consumer dropping duplicates sees
            timeline[fragment.producer_ms] = fragment
        lost = self._kvs._faults.lose_persisted_ack_at
        if fragment.timecode in lost:
            lost.discard(fragment.timecode)
            await self._settle_acks()
            self._request.transport.close()  # type: ignore[union-attr]
            return
        await self._ack("PERSISTED", fragment.timecode)

    async def _settle_acks(self) -> None:
        """Before a fault: let the other fragments persist and their acks reach the client
        (an aborted response can lose lines the client had not read yet)."""
        current = asyncio.current_task()
        await asyncio.gather(*(t for t in self._persists if t is not current))
        await asyncio.sleep(0.2)

    async def _idle_acks(self) -> None:
        while True:
            await asyncio.sleep(self._kvs._idle_ack_s)
            if time.monotonic() - self._last_data_at >= self._kvs._idle_ack_s:
                await self._write({"EventType": "IDLE"})

    async def _ack(self, event: str, timecode: int) -> None:
        await self._write(
            {
                "EventType": event,
                "FragmentTimecode": timecode,
                "FragmentNumber": self._kvs._next_fragment_number(),
            }
        )

    async def _ack_error(self, timecode: int, error_id: int, note: str = "") -> None:
        self._kvs.rejected.append((timecode, error_id))
        await self._write(
            {
                "EventType": "ERROR",
                "FragmentTimecode": timecode,
                "FragmentNumber": self._kvs._next_fragment_number(),
                "ErrorId": error_id,
                "ErrorCode": ACK_ERRORS.get(error_id, "UNKNOWN_ERROR"),
            }
        )

    async def _write(self, doc: dict) -> None:
        async with self._write_lock:
            await self._response.write(json.dumps(doc).encode() + b"\n")


def _error(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response(
        {"message": message}, status=status, headers={"x-amz-ErrorType": f"{error_type}:"}
    )


# --- media for driving a mirror in tests ----------------------------------------------
def gradient_frame(index: int, width: int = 64, height: int = 64) -> np.ndarray:
    """A moving colour gradient: every frame differs, so the encoder has real work."""
    y, x = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), np.uint8)
    frame[..., 0] = (x * 4 + index * 3) % 256
    frame[..., 1] = (y * 4 + index * 5) % 256
    frame[..., 2] = ((x + y) * 2 + index * 7) % 256
    return frame


def sine_pcm(start: int, count: int, hz: float = 440.0, channels: int = 1) -> np.ndarray:
    """int16 48 kHz tone samples [start, start + count), shaped (count,) or (count, 2)."""
    t = np.arange(start, start + count) / 48_000
    tone = (np.sin(2 * np.pi * hz * t) * 0.4 * 32767).astype(np.int16)
    return tone if channels == 1 else np.stack([tone, tone], axis=1)


async def feed(mirror, frames: int, fps: int = 25, speed: float = 0.0, first: int = 0) -> None:
    """Put `frames` video frames and their 20 ms audio chunks, as a session would.

    `speed` 0 goes as fast as possible (yielding to the loop now and then); 1.0 is real time.
    """
    samples_per_frame = 48_000 // fps
    started = time.monotonic()
    for n in range(first, first + frames):
        mirror.put_video(gradient_frame(n), n)
        base = n * samples_per_frame
        for offset in range(0, samples_per_frame, 960):
            mirror.put_audio(sine_pcm(base + offset, 960), base + offset)
        if speed:
            await asyncio.sleep(
                max(0.0, started + (n - first + 1) / (fps * speed) - time.monotonic())
            )
        elif n % 5 == 4:
            await asyncio.sleep(0.005)  # let the worker drain the bounded input buffer


async def _serve(args: argparse.Namespace) -> None:
    endpoint = FakeKvsEndpoint(args.access_key, args.secret_key, args.region)
    url = await endpoint.start(args.port)
    print(f"fake PutMedia endpoint at {url} (Ctrl-C to stop)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for stream in endpoint.headers:
            path = args.out.replace(".mkv", f"-{stream}.mkv")
            with open(path, "wb") as out:  # noqa: ASYNC230 - at exit, nothing else runs
                out.write(endpoint.mkv(stream))
            print(f"{stream}: {len(endpoint.fragments(stream))} fragments -> {path}")
        await endpoint.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8555)
    parser.add_argument("--access-key", default="AKIDFAKE")
    parser.add_argument("--secret-key", default="fake")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--out", default="kvs-received.mkv")
    try:
        asyncio.run(_serve(parser.parse_args()))
    except KeyboardInterrupt:
        pass


AWS_TEST_KEY, AWS_TEST_SECRET = "AKIDKVSTEST", "kvs-test-secret"  # moto accepts any
KEY, SECRET, REGION = AWS_TEST_KEY, AWS_TEST_SECRET, "us-west-2"


FPS = 25


def options(endpoint: FakeKvsEndpoint, **overrides) -> KvsOptions:
    settings = dict(
        stream="show",
        region=REGION,
        create=True,
        endpoint_url=endpoint.url,
        input_buffer_s=30.0,  # tests feed faster than real time
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        close_timeout_s=20.0,
    )
    settings.update(overrides)
    return KvsOptions(**settings)


def assert_clean_timeline(endpoint: FakeKvsEndpoint, stream: str, fragment_ms: int, count: int):
    fragments = endpoint.fragments(stream)
    assert [f.timecode for f in fragments] == [k * fragment_ms for k in range(count)], (
        "every fragment exactly once, no gap"
    )
    assert endpoint.duplicates == []
    producer = [f.producer_ms for f in fragments]
    assert producer == sorted(set(producer))
    for fragment in fragments:
        assert fragment.info.starts_with_keyframe_on == 1
        assert fragment.info.tracks == {1, 2}
