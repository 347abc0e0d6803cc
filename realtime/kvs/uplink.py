"""Keeps one PutMedia connection per stream alive and the ledger's fragments flowing into it.

Each connection: sign, open with the MKV header, send every fragment still in the ledger
(oldest first, with its original timecode), then new ones as they come, at most
`max_fragments_per_s`; a reader task applies acks to the ledger meanwhile. The
connection ends on an ERROR ack, a dropped socket, an HTTP error, silence from KVS while
fragments wait, or when the data endpoint is due for a refresh; the loop then backs off
(exponentially, with jitter) and opens the next one, which resends whatever KVS has not
persisted. Timecodes are relative to one producer start timestamp for the mirror's whole
life, so a resent fragment lands exactly where it would have: no gap, no duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from pathlib import Path
from typing import BinaryIO

import aiohttp

from realtime.kvs.control import KvsControlPlane, StreamInfo
from realtime.kvs.errors import (
    KvsError,
    KvsThrottled,
    PutMediaConnectionLost,
    PutMediaHttpError,
)
from realtime.kvs.ledger import FragmentLedger
from realtime.kvs.metrics import KvsMetrics, KvsStats
from realtime.kvs.options import KvsOptions
from realtime.kvs.putmedia import (
    RETRY_CODES,
    STREAM_FATAL_CODES,
    Ack,
    PutMediaConnection,
    signed_headers,
)

log = logging.getLogger(__name__)

MAX_AUTH_FAILURES = 3  # consecutive 401/403 answers before the mirror gives up


class AckErrorEvent(KvsError):
    """KVS sent an ERROR acknowledgement; the connection is over."""

    def __init__(self, ack: Ack, stream: str) -> None:
        code = ack.error_id or 0
        super().__init__(f"ERROR {code} {ack.error_name} for the fragment at {ack.timecode} ms")
        self.ack = ack
        self.kind = f"ack_{code}"
        self.retryable = code not in STREAM_FATAL_CODES


class _Rotate(Exception):
    """The data endpoint is due for a refresh: end this connection cleanly."""


class FragmentPacer:
    """At most `rate` fragment starts in any window of one second (a PutMedia limit)."""

    def __init__(self, rate: float, margin: float = 1.05) -> None:
        self._count = max(1, int(rate))
        self._window = margin
        self._starts: deque[float] = deque(maxlen=self._count)

    async def wait_turn(self) -> None:
        if len(self._starts) == self._count:
            wait = self._starts[0] + self._window - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        self._starts.append(time.monotonic())


class KvsUplink:
    def __init__(
        self,
        options: KvsOptions,
        stream: str,
        ledger: FragmentLedger,
        stats: KvsStats,
        metrics: KvsMetrics,
    ) -> None:
        self._options = options
        self._control: KvsControlPlane | None = None  # built in a thread: boto3 blocks
        self._ledger = ledger
        self._stats = stats
        self._metrics = metrics
        self._stream = stream
        self._pacer = FragmentPacer(options.max_fragments_per_s)
        self._backoff = options.backoff_initial_s
        self._auth_failures = 0
        self._refresh_endpoint = False

    async def run(self) -> None:
        """Until the ledger is settled (after `finish_input`) or a fatal error.

        Every error is logged and counted here before it is raised.
        """
        info = await self._prepare_stream()
        if info.retention_hours == 0:
            self._ledger.final_event = "RECEIVED"
        log.info("KVS stream %s ready (%s); mirroring", self._stream, info.arn)
        async with aiohttp.ClientSession() as http:
            while True:
                await self._ledger.wait_ready()
                if self._ledger.settled:
                    return
                try:
                    await self._connection(http)
                    self._backoff = self._options.backoff_initial_s
                except _Rotate:
                    log.info("KVS stream %s: refreshing the data endpoint", self._stream)
                    self._refresh_endpoint = True
                    continue
                except KvsError as exc:
                    self._on_error(exc)
                    if not exc.retryable:
                        raise
                    self._give_up_stuck_fragments()
                    await self._sleep_backoff()

    async def _prepare_stream(self) -> StreamInfo:
        while True:
            try:
                if self._control is None:
                    self._control = await asyncio.to_thread(
                        KvsControlPlane, self._options, self._stream
                    )
                return await asyncio.to_thread(self._control.ensure_stream)
            except KvsError as exc:
                self._on_error(exc)
                if not exc.retryable:
                    raise
                await self._sleep_backoff()

    # --- one connection --------------------------------------------------------------
    async def _connection(self, http: aiohttp.ClientSession) -> None:
        assert self._control is not None
        endpoint = await asyncio.to_thread(self._control.data_endpoint, self._refresh_endpoint)
        self._refresh_endpoint = False
        credentials = await asyncio.to_thread(self._control.credentials)
        url = f"{endpoint}/putMedia"
        assert self._ledger.header is not None and self._ledger.producer_start_s is not None
        headers = signed_headers(
            url, self._stream, self._ledger.producer_start_s, credentials, self._control.region
        )
        self._stats.connections += 1
        self._metrics.connections.inc()
        dump = self._open_dump()
        connection = PutMediaConnection(http, url, headers, dump)
        opened_at = time.monotonic()
        sender: asyncio.Task[None] | None = None
        try:
            await connection.open(self._ledger.header)
            self._auth_failures = 0
            sender = asyncio.create_task(self._send_all(connection, opened_at))
            await self._pump_acks(connection, sender)
        finally:
            if sender is not None:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            connection.close()
            if dump is not None:
                dump.close()

    def _open_dump(self) -> BinaryIO | None:
        """`--kvs-dump-dir`: this connection's bytes go to DIR/STREAM-N.mkv as well."""
        if self._options.dump_dir is None:
            return None
        folder = Path(self._options.dump_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return open(folder / f"{self._stream}-{self._stats.connections}.mkv", "wb")

    async def _pump_acks(  # noqa: C901 - one wait loop over acks, silence and the sender; the cases are the protocol's
        self, connection: PutMediaConnection, sender: asyncio.Task
    ) -> None:
        """Apply acks until the connection is over: return when all is sent and settled,
        else raise why it ended.

        After an ERROR ack nothing more is sent, but acks are still read until KVS closes
        the response (or goes quiet): PERSISTED acks for earlier fragments may follow, and
        resending those would duplicate them in the stream.
        """
        acks = connection.acks().__aiter__()
        next_ack: asyncio.Future | None = None
        error: AckErrorEvent | None = None
        try:
            while True:
                if next_ack is None:
                    next_ack = asyncio.ensure_future(anext(acks))
                waiting = {next_ack} if sender.done() else {next_ack, sender}
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=self._options.ack_timeout_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:  # silence
                    if error is not None:
                        raise error
                    if self._ledger.outstanding():
                        raise PutMediaConnectionLost(
                            f"no acknowledgement for {self._options.ack_timeout_s:g} s"
                        )
                    continue
                if sender in done and error is None:
                    sender.result()  # raises _Rotate
                    return  # input over, every fragment final
                if next_ack not in done:
                    continue
                try:
                    ack = next_ack.result()
                except StopAsyncIteration:
                    if error is not None:
                        raise error from None
                    raise PutMediaConnectionLost("KVS closed the PutMedia response") from None
                next_ack = None
                if ack.event_type == "ERROR":
                    if error is None:
                        error = self._on_ack_error(ack)
                        sender.cancel()
                else:
                    self._apply(ack)
        finally:
            if next_ack is not None:
                next_ack.cancel()

    async def _send_all(self, connection: PutMediaConnection, opened_at: float) -> None:
        last_sent = -1  # timecode of the last fragment sent on this connection
        while True:
            if time.monotonic() - opened_at > self._options.endpoint_refresh_s:
                await connection.end_body()
                await self._wait_acked()
                raise _Rotate()
            record = await self._ledger.next_after(last_sent)
            if record is None:  # input over: finish the body, wait for the last acks
                await connection.end_body()
                await self._ledger.wait_settled()
                return
            await self._pacer.wait_turn()
            self._ledger.mark_sent(record)
            await connection.send(record.fragment.data)
            last_sent = record.timecode

    async def _wait_acked(self) -> None:
        """Before rotating: let KVS acknowledge what it has, bounded by `ack_timeout_s`."""
        deadline = time.monotonic() + self._options.ack_timeout_s
        while self._ledger.outstanding():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ledger.wait_change(), remaining)

    def _apply(self, ack: Ack) -> None:
        if ack.event_type == "IDLE":
            self._stats.idle_acks += 1
            return
        if ack.timecode is None:
            return
        record = self._ledger.on_progress(ack.timecode, ack.event_type)
        if record is not None:
            self._backoff = self._options.backoff_initial_s

    def _on_ack_error(self, ack: Ack) -> AckErrorEvent:
        code = ack.error_id or 0
        record = self._ledger.record_at(ack.timecode)
        if record is not None and code not in RETRY_CODES and code not in STREAM_FATAL_CODES:
            # The fragment itself is bad: sending the same bytes again would fail again.
            log.error(
                "KVS stream %s: fragment at %d ms rejected with %d %s; dropping it",
                self._stream,
                record.timecode,
                code,
                ack.error_name,
            )
            self._ledger.fail(record, f"ack_{code}")
        return AckErrorEvent(ack, self._stream)

    # --- failures ------------------------------------------------------------------
    def _on_error(self, exc: KvsError) -> None:
        kind = exc.kind
        if isinstance(exc, PutMediaHttpError):
            kind = self._classify_http(exc)
        self._stats.errors[kind] += 1
        self._metrics.errors.labels(kind).inc()
        if exc.retryable:
            log.warning(
                "KVS stream %s: %s; reconnecting in about %.1f s and resending %d fragment(s)",
                self._stream,
                exc,
                self._backoff,
                len(self._ledger),
            )
            received = self._ledger.received_unpersisted()
            if received:  # the lost-ack policy of realtime.kvs.ledger
                log.warning(
                    "KVS stream %s: %d of them KVS had RECEIVED and may have persisted (the "
                    "ack was lost): the stream may hold them twice, with the same producer "
                    "timestamp",
                    self._stream,
                    received,
                )
        else:
            log.error(
                "KVS stream %s: %s; mirroring stopped (the session goes on)", self._stream, exc
            )

    def _classify_http(self, exc: PutMediaHttpError) -> str:
        if exc.status >= 500:
            return f"http_{exc.status}"
        if exc.error_type in ("ClientLimitExceededException", "ConnectionLimitExceededException"):
            return KvsThrottled.kind
        if exc.status in (401, 403):
            self._auth_failures += 1
            exc.retryable = self._auth_failures < MAX_AUTH_FAILURES
            return "access_denied"
        if exc.status == 404:
            exc.retryable = False
            return "stream_not_found"
        if exc.error_type == "InvalidEndpointException":
            self._refresh_endpoint = True
        return f"http_{exc.status}"

    def _give_up_stuck_fragments(self) -> None:
        for record in self._ledger.over_attempts(self._options.max_attempts):
            log.error(
                "KVS stream %s: fragment at %d ms failed after %d sends; dropping it",
                self._stream,
                record.timecode,
                record.sends,
            )
            self._ledger.fail(record, "max_attempts")

    async def _sleep_backoff(self) -> None:
        delay = self._backoff * random.uniform(0.5, 1.0)
        self._backoff = min(self._backoff * 2, self._options.backoff_max_s)
        await asyncio.sleep(delay)
