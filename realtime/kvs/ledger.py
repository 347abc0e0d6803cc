"""The retry buffer: every fragment from encoding until KVS persists it (or we give up).

Lives on the event loop. The encoder thread adds fragments (through
`loop.call_soon_threadsafe`), the uplink sends them and reports acks. A fragment leaves
the ledger only when it is final (PERSISTED, or RECEIVED for a stream that keeps no
data), failed, or pushed out because the buffer holds more than its bound of media; after
a reconnect everything still in the ledger is resent.

Lost acks: at least once, duplicates marked by their timestamp. When a connection drops,
a fragment whose PERSISTED ack never arrived may or may not be stored: KVS may have
persisted it and the ack died with the socket. Such a fragment is resent, because AWS
tells producers to keep a fragment until PERSISTED, and a gap in a broadcast cannot be
repaired while a duplicate can be dropped. A resent fragment carries the same bytes, the
same cluster timecode and, since the producer start timestamp is fixed for the mirror's
whole life, the same producer timestamp as the first copy: a consumer keeps the first
fragment of each producer timestamp. Fragments with no ack, or only BUFFERING, cannot be
stored (KVS had not received them whole), so resending them never duplicates; those that
were RECEIVED may be, and each such resend is counted (`possible_duplicates`,
`facecast_kvs_fragments_possible_duplicates_total`) and logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from realtime.kvs.metrics import KvsMetrics, KvsStats
from realtime.kvs.mkv import MkvFragment

log = logging.getLogger(__name__)


@dataclass
class FragmentRecord:
    fragment: MkvFragment
    state: str = "queued"  # queued, sent, buffering, received
    sends: int = 0
    sent_at: float = 0.0

    @property
    def timecode(self) -> int:
        return self.fragment.timecode_ms


class FragmentLedger:
    def __init__(
        self, stream: str, capacity_s: float, stats: KvsStats, metrics: KvsMetrics
    ) -> None:
        self._stream = stream
        self._capacity_ms = capacity_s * 1000.0
        self._stats = stats
        self._metrics = metrics
        self._records: dict[int, FragmentRecord] = {}  # by timecode, in insertion order
        self._held_ms = 0
        self._changed = asyncio.Event()
        self.header: bytes | None = None
        self.producer_start_s: float | None = None
        self.final_event = "PERSISTED"
        self.input_finished = False

    # --- producer side -------------------------------------------------------------
    def set_origin(self, header: bytes, producer_start_s: float) -> None:
        self.header = header
        self.producer_start_s = producer_start_s
        self._notify()

    def add(self, fragment: MkvFragment) -> None:
        self._records[fragment.timecode_ms] = FragmentRecord(fragment)
        self._held_ms += fragment.duration_ms
        self._stats.fragments_encoded += 1
        self._evict_overflow()
        self._update_gauge(fragment.duration_ms)
        self._notify()

    def finish_input(self) -> None:
        self.input_finished = True
        self._notify()

    # --- uplink side ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._records)

    @property
    def settled(self) -> bool:
        """No more fragments will come and none is waiting for KVS."""
        return self.input_finished and not self._records

    def outstanding(self) -> int:
        return sum(1 for r in self._records.values() if r.state != "queued")

    async def next_after(self, timecode: int) -> FragmentRecord | None:
        """The first fragment after `timecode` still in the ledger; None once input is over."""
        while True:
            for record in self._records.values():
                if record.timecode > timecode:
                    return record
            if self.input_finished:
                return None
            await self._wait_change()

    async def wait_settled(self) -> None:
        while not self.settled:
            await self._wait_change()

    async def wait_ready(self) -> None:
        """Until the header and a first fragment exist (nothing to connect for before)."""
        while self.header is None or (not self._records and not self.input_finished):
            await self._wait_change()

    def received_unpersisted(self) -> int:
        """Fragments KVS acknowledged as RECEIVED but not (yet) as PERSISTED."""
        return sum(1 for r in self._records.values() if r.state == "received")

    def mark_sent(self, record: FragmentRecord) -> None:
        if record.state == "received":  # its PERSISTED ack was lost: KVS may store it twice
            self._stats.possible_duplicates += 1
            self._metrics.possible_duplicates.inc()
        record.sends += 1
        record.state = "sent"
        record.sent_at = time.monotonic()
        self._stats.fragments_sent += 1
        self._metrics.fragments_sent.inc()
        if record.sends > 1:
            self._stats.fragments_retried += 1
            self._metrics.fragments_retried.inc()

    def on_progress(self, timecode: int, event: str) -> FragmentRecord | None:
        """BUFFERING / RECEIVED / PERSISTED for `timecode`; returns the record if now final."""
        record = self._records.get(timecode)
        if record is None:
            return None  # already final, or evicted: an ack for it changes nothing
        record.state = event.lower()
        if event != self.final_event and event != "PERSISTED":
            return None
        latency = time.monotonic() - record.sent_at
        self._stats.note_latency(latency)
        self._metrics.ack_latency.observe(latency)
        self._stats.fragments_persisted += 1
        self._metrics.fragments_persisted.inc()
        self._remove(record)
        return record

    def fail(self, record: FragmentRecord, reason: str) -> None:
        """Give up on one fragment: it leaves a gap in the KVS timeline."""
        if self._records.get(record.timecode) is not record:
            return
        self._stats.fragments_failed += 1
        self._metrics.fragments_failed.labels(reason).inc()
        self._remove(record)

    def over_attempts(self, max_sends: int) -> list[FragmentRecord]:
        return [r for r in self._records.values() if r.sends >= max_sends]

    def record_at(self, timecode: int | None) -> FragmentRecord | None:
        return self._records.get(timecode) if timecode is not None else None

    def drop_all(self, reason: str) -> int:
        records = list(self._records.values())
        for record in records:
            self.fail(record, reason)
        return len(records)

    # --- internals -----------------------------------------------------------------
    def _remove(self, record: FragmentRecord) -> None:
        del self._records[record.timecode]
        self._held_ms -= record.fragment.duration_ms
        self._update_gauge(-record.fragment.duration_ms)
        self._notify()

    def _evict_overflow(self) -> None:
        while self._held_ms > self._capacity_ms and len(self._records) > 1:
            oldest = next(iter(self._records.values()))
            log.warning(
                "KVS stream %s: retry buffer full (%.0f s of media not yet persisted); "
                "dropping the fragment at %d ms, which leaves a gap in the stream",
                self._stream,
                self._capacity_ms / 1000,
                oldest.timecode,
            )
            self._stats.fragments_overflowed += 1
            self._stats.errors["retry_buffer_overflow"] += 1
            self._metrics.errors.labels("retry_buffer_overflow").inc()
            self.fail(oldest, "retry_buffer_overflow")

    def _update_gauge(self, delta_ms: int) -> None:
        self._metrics.retry_buffer_seconds.inc(delta_ms / 1000.0)

    def _notify(self) -> None:
        self._changed.set()

    async def wait_change(self) -> None:
        """Until anything in the ledger changes."""
        await self._wait_change()

    async def _wait_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()
