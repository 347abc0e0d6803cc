"""The front's view of the workers: who is there, how full, who is gone; and offer placement.

Workers are found by name in the cluster (`ray.util.list_named_actors`), so a worker any
front created, or one that Ray placed on a node that just joined, enters the pool at the
next look. Each worker is asked for its `status()` every `probe_interval_s`, with at most
one question outstanding, so a worker still waiting for a node (Ray holds its creation
until resources appear; the autoscaler scales on exactly that demand) simply stays
`pending`, and every call has a timeout.

A worker is lost when Ray reports it dead (`ActorDiedError`: its process was killed, its
node is gone) or when it has not answered for `lost_after_s`; a silent one is then fenced
(`ray.kill`), so a worker the registry calls dead never keeps serving. Its sessions are
ended in the registry with the reason, its slots leave the pool, and offers go to the
others. A draining worker takes no new session and is ended once its last one closes.

States: pending (not placed yet, or its process is starting) → starting (engine warm-up) →
ok → draining → drained; failed (its start-up failed: the reason is kept); lost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from pipeline.startup import EngineOptions
from realtime.errors import (
    EngineStarting,
    RealtimeError,
    ServerFull,
    SessionNotFound,
    WorkerUnavailable,
)
from realtime.fleet.actor import worker_actor
from realtime.fleet.answers import error_from
from realtime.fleet.options import WORKER_PREFIX, FleetOptions, worker_resources
from realtime.fleet.registry import registry_actor
from realtime.service import ServerConfig

log = logging.getLogger(__name__)
GONE = ("lost", "drained", "failed")
BEAT_S, STALL_S = 0.1, 0.5  # the front's own heartbeat, and a lag that counts as a stall
REGISTRY_RETRY_S = 0.2  # between attempts of a registry call lost to its restart


@dataclass
class WorkerView:
    name: str
    handle: Any
    state: str = "pending"
    status: dict = field(default_factory=dict)  # the worker's last answer
    last_seen: float | None = None  # monotonic time of its last answer
    added: float = field(default_factory=time.monotonic)
    probe: asyncio.Future | None = None
    probe_sent: float = 0.0
    reserved: int = 0  # offers this front is placing on it now
    refused: bool = False  # it answered an offer "full": no more until its next status
    reason: str | None = None  # why it failed or was lost
    starting: asyncio.Future | None = None

    def free(self) -> int:
        if self.state != "ok" or self.status.get("draining") or self.refused:
            return 0
        s = self.status
        return max(0, s["max_sessions"] - len(s["sessions"]) - s["reserved"] - self.reserved)

    def describe(self) -> dict:
        s = self.status
        body = {
            "name": self.name,
            "state": self.state,
            "node_id": s.get("node_id"),
            "node_ip": s.get("node_ip"),
            "sessions": len(s.get("sessions", [])),
            "max_sessions": s.get("max_sessions"),
            "free": self.free(),
        }
        if self.reason:
            body["reason"] = self.reason
        if "startup_seconds" in s:
            body["startup_seconds"] = s["startup_seconds"]
        return body


async def call(ref: Any, timeout: float) -> Any:
    """Await a Ray call with a deadline (asyncio.TimeoutError past it)."""
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)


class WorkerPool:
    """Creates the workers it is asked for, watches every worker of the namespace, places
    offers and routes calls. One per front; all state that matters lives in the cluster."""

    def __init__(
        self,
        options: FleetOptions,
        worker_config: ServerConfig,
        engine_options: EngineOptions,
        device: str,
        reference: bytes | None = None,
    ) -> None:
        self.options = options
        self.worker_config = worker_config  # what each worker's server runs with
        self.engine_options = engine_options
        self.device = device  # "cuda" (a GPU per worker) or "cpu" (a CPU worker slot)
        self.reference = reference
        self.workers: dict[str, WorkerView] = {}
        self.registry: Any = None
        self._tasks: list[asyncio.Task] = []
        self._changed = asyncio.Event()
        self._resumed = 0.0  # when this front's event loop last came back from a stall
        self._beat = time.monotonic()
        self.on_lost: list[Callable[[WorkerView], object]] = []  # after a loss (metrics)

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """The registry and the `options.workers` named workers (existing ones are reused),
        then the watch loop."""
        self.registry = await asyncio.to_thread(registry_actor, self.options.namespace)
        placement = worker_resources(self.device)
        for index in range(self.options.workers):
            name = self.options.worker_name(index)
            cls = worker_actor(
                name, self.options.namespace, placement, self.options.worker_restarts
            )
            args = (name, self.worker_config, self.engine_options, self.reference, self.registry)
            handle = await asyncio.to_thread(functools.partial(cls.remote, *args))
            self._add(name, handle)
        await self._discover()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._watch(), name="fleet-watch"),
            loop.create_task(self._heartbeat(), name="fleet-heartbeat"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _add(self, name: str, handle: Any) -> WorkerView:
        view = self.workers.get(name)
        if view is None or view.state in GONE:
            view = self.workers[name] = WorkerView(name, handle)
            # start() is idempotent: it waits for the worker's node and its warm-up
            view.starting = _quiet(asyncio.wrap_future(handle.start.remote().future()))
        return view

    async def _discover(self) -> None:
        """Named workers this front has not seen (another front's, a restarted one's)."""
        import ray

        listed = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        for entry in listed:
            name = entry["name"]
            if entry["namespace"] != self.options.namespace or not name.startswith(WORKER_PREFIX):
                continue
            view = self.workers.get(name)
            if view is not None and view.state not in GONE:
                continue
            try:
                handle = await asyncio.to_thread(
                    ray.get_actor, name, namespace=self.options.namespace
                )
            except ValueError:  # gone between the listing and the lookup
                continue
            if view is not None and _actor_id(handle) == _actor_id(view.handle):
                # The same actor: ended and still listed until Ray removes it, unless it
                # was lost and Ray may restart it (--worker-restarts): then it rejoins as a
                # new incarnation once it is back.
                if view.state != "lost" or self.options.worker_restarts == 0:
                    continue
            self._add(name, handle)

    # ---- watching --------------------------------------------------------------------

    async def _watch(self) -> None:
        tick = 0
        while True:
            try:
                if tick % 4 == 0:
                    await self._discover()
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fleet: watching the workers failed")
            tick += 1
            await asyncio.sleep(self.options.probe_interval_s)

    async def _heartbeat(self) -> None:
        """Beat every `BEAT_S` while this front's loop runs on time (see `refresh`)."""
        while True:
            now = time.monotonic()
            if now - self._beat > BEAT_S + STALL_S:
                self._resumed = now
            self._beat = now
            await asyncio.sleep(BEAT_S)

    async def refresh(self, wait: float = 0.0) -> None:
        """Ask each worker how it is; with `wait`, give the answers that long to arrive."""
        now = time.monotonic()
        if now - self._beat > BEAT_S + STALL_S:
            self._resumed = now  # the loop itself was held up: workers' answers may wait
        for view in list(self.workers.values()):
            if view.state in GONE:
                continue
            if view.probe is None:
                view.probe = _quiet(asyncio.wrap_future(view.handle.status.remote().future()))
                view.probe_sent = now
        probes = [v.probe for v in self.workers.values() if v.probe is not None]
        if wait and probes:
            await asyncio.wait(probes, timeout=wait)
        for view in list(self.workers.values()):
            if view.state not in GONE:
                await self._settle(view)

    async def _settle(self, view: WorkerView) -> None:
        probe, now = view.probe, time.monotonic()
        if probe is not None and probe.done():
            view.probe = None
            error = probe.exception()
            if error is None:
                await self._answered(view, probe.result(), now)
            elif _actor_died(error):
                await self._lost(view, f"worker {view.name} died: {_death_cause(error)}")
                return
        # Silence counts from the last answer, or from the end of the last stall of this
        # front's own loop (a paused process, an overloaded host): answers that came in
        # meanwhile may still be waiting to be read.
        silent = now - max(view.last_seen or view.probe_sent, self._resumed)
        if view.last_seen is not None and silent > self.options.lost_after_s:
            await self._lost(
                view, f"worker {view.name} did not answer for {self.options.lost_after_s:g} s"
            )

    async def _answered(self, view: WorkerView, status: dict, now: float) -> None:
        before = view.status.get("incarnation")
        if before is not None and status["incarnation"] != before:
            # Ray restarted the actor: the sessions of the old process are gone
            await self._end_sessions(view, before, f"worker {view.name} restarted")
            view.starting = _quiet(asyncio.wrap_future(view.handle.start.remote().future()))
        view.status, view.last_seen, view.refused = status, now, False
        state = status["state"]
        if state == "new":
            state = "starting"
        if state == "failed":
            view.reason = f"worker {view.name} failed to start: {status.get('error')}"
            log.error("fleet: %s", view.reason)
            await self._kill(view, no_restart=True)  # a restart would fail the same way
        elif status["draining"]:
            state = "draining"
            if not status["sessions"] and not status["reserved"]:
                state = "drained"
                log.info("fleet: worker %s drained; ending it", view.name)
                await self._kill(view, no_restart=True)
        if state != view.state:
            if state == "ok":
                log.info("fleet: worker %s ready on node %s", view.name, status["node_ip"])
            view.state = state
            self._changed.set()

    async def _lost(self, view: WorkerView, reason: str) -> None:
        view.state, view.reason, view.probe = "lost", reason, None
        log.warning("fleet: %s; its sessions end", reason)
        # Fence it: a worker the registry calls dead never serves on. Ray may restart it
        # (--worker-restarts): that is a new incarnation, with no sessions.
        await self._kill(view, no_restart=False)
        incarnation = view.status.get("incarnation")
        if incarnation is not None:
            await self._end_sessions(view, incarnation, reason)
        for callback in self.on_lost:
            callback(view)
        self._changed.set()

    async def _end_sessions(self, view: WorkerView, incarnation: str, reason: str) -> None:
        try:
            ended = await self.registry_call("worker_lost", view.name, incarnation, reason)
            if ended:
                log.info("fleet: sessions %s ended (%s)", ", ".join(ended), reason)
        except Exception as exc:
            log.error("fleet: could not record the end of %s's sessions: %s", view.name, exc)

    async def _kill(self, view: WorkerView, no_restart: bool) -> None:
        import ray

        try:
            await asyncio.to_thread(ray.kill, view.handle, no_restart=no_restart)
        except Exception as exc:  # already gone
            log.debug("fleet: kill %s: %s", view.name, exc)

    # ---- placement and routing -------------------------------------------------------

    def capacity(self) -> dict:
        ready = [v for v in self.workers.values() if v.state == "ok"]
        return {
            "workers": len(ready),
            "slots": sum(v.status["max_sessions"] for v in ready),
            "free": sum(v.free() for v in ready),
        }

    async def place(self, method: str, *args: object) -> dict:
        """An offer negotiated on the worker with the most free slots, by its `method`
        (`offer`, `whip_offer`) with `args`. 503 when every worker is full (after asking
        them afresh), or when those with room failed (gone, or no answer in time)."""
        tried: set[str] = set()
        failures: list[str] = []  # workers that had room but did not answer
        for fresh in (False, True):
            if fresh:
                await self.refresh(wait=self.options.call_timeout_s)
            order = sorted(self.workers.values(), key=lambda v: (-v.free(), v.name))
            for view in order:
                if view.free() <= 0 or view.name in tried:
                    continue
                tried.add(view.name)
                answer = await self._offer_on(view, method, args, failures)
                if answer is not None:
                    return answer
        if failures:  # not "full": say which workers failed and how
            raise WorkerUnavailable(f"no worker could take the offer: {'; '.join(failures)}")
        raise self._no_room()

    async def _offer_on(
        self, view: WorkerView, method: str, args: tuple, failures: list[str]
    ) -> dict | None:
        view.reserved += 1
        try:
            ref = getattr(view.handle, method).remote(*args)
            answer = await call(ref, self.options.offer_timeout_s)
        except Exception as exc:  # dead or too slow: the watch loop decides which
            if isinstance(exc, asyncio.TimeoutError):
                why = f"worker {view.name} did not answer within {self.options.offer_timeout_s:g} s"
            elif _actor_died(exc):
                why = f"worker {view.name} is gone"
            else:
                why = f"worker {view.name} failed: {_first_line(exc)}"
            log.warning("fleet: offer on %s failed: %s", view.name, why)
            failures.append(why)
            return None
        finally:
            view.reserved -= 1
        if "error" in answer:
            if answer["status"] == 503:  # full (another front's offer), draining, not warm
                view.refused = True
                return None
            raise error_from(answer)
        view.status = {**view.status, "sessions": [*view.status["sessions"], answer["session_id"]]}
        return answer

    @staticmethod
    def session_ended(view: WorkerView, session_id: str) -> None:
        """A session this front closed on `view`: its slot is free now, not at the worker's
        next status (a caller that deletes one session and opens another is let in)."""
        sessions = [s for s in view.status.get("sessions", []) if s != session_id]
        view.status = {**view.status, "sessions": sessions}
        view.refused = False

    def _no_room(self) -> RealtimeError:
        views = list(self.workers.values())
        ready = [v for v in views if v.state == "ok"]
        if ready:
            cap = self.capacity()
            return ServerFull(
                f"every worker is full: {len(ready)} workers, {cap['slots']} session slots, "
                "all taken; try again later"
            )
        waiting = [v for v in views if v.state in ("pending", "starting")]
        failed = [v.reason or v.name for v in views if v.state == "failed"]
        if waiting:
            return EngineStarting(
                f"no worker is ready yet ({len(waiting)} starting or waiting for a node); "
                "retry when /healthz is ok"
            )
        why = "; ".join(failed) if failed else "no worker is running"
        return EngineStarting(f"no worker can take sessions: {why}")

    async def session_worker(self, session_id: str) -> tuple[dict, WorkerView]:
        """The registry's record of a live session and its worker (404 if not live)."""
        record = await self.registry_call("lookup", session_id)
        if record is None:
            raise SessionNotFound(f"no live session {session_id!r}")
        if record["state"] != "live":
            raise SessionNotFound(f"session {session_id!r} has closed: {record.get('reason')}")
        view = self.workers.get(record["worker"])
        if view is None or view.state in GONE:
            raise WorkerUnavailable(
                f"session {session_id!r} runs on worker {record['worker']}, which is gone"
            )
        return record, view

    async def on_worker(
        self, view: WorkerView, method: str, *args: object, timeout: float | None = None
    ) -> Any:
        """One call to a worker, bounded by `timeout` (default `call_timeout_s`); a worker
        that is gone or does not answer is a WorkerUnavailable (503) that says which."""
        timeout = self.options.call_timeout_s if timeout is None else timeout
        try:
            return await call(getattr(view.handle, method).remote(*args), timeout)
        except asyncio.TimeoutError:
            raise WorkerUnavailable(
                f"worker {view.name} did not answer within {timeout:g} s"
            ) from None
        except Exception as exc:
            if _actor_died(exc):
                raise WorkerUnavailable(f"worker {view.name} is gone") from None
            if _ray_error(exc):  # ActorUnavailableError: unreachable for now
                raise WorkerUnavailable(
                    f"worker {view.name} cannot be reached now: {_first_line(exc)}"
                ) from None
            raise

    async def registry_call(self, method: str, *args: object) -> Any:
        """One call to the registry within `call_timeout_s`. A call lost while Ray restarts
        the registry (it was in flight when its process died) is sent again until then:
        calls sent meanwhile wait in Ray's queue for the new process."""
        timeout = self.options.call_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            try:
                ref = getattr(self.registry, method).remote(*args)
                return await call(ref, max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise WorkerUnavailable(
                    f"the session registry did not answer within {timeout:g} s"
                ) from None
            except Exception as exc:
                if not _ray_error(exc):
                    raise
                if time.monotonic() + REGISTRY_RETRY_S >= deadline:
                    raise WorkerUnavailable(
                        f"the session registry is unavailable: {_first_line(exc)}"
                    ) from None
                await asyncio.sleep(REGISTRY_RETRY_S)

    async def sessions(self) -> list[dict]:
        """Every session the registry knows, live ones with their worker's current stats."""
        records = await self.registry_call("list")
        live = [v for v in self.workers.values() if v.state in ("ok", "draining")]
        answers = await asyncio.gather(
            *(self.on_worker(v, "describe_sessions") for v in live), return_exceptions=True
        )
        stats = {d["id"]: d for answer in answers if isinstance(answer, list) for d in answer}
        out = []
        for record in records:
            now = stats.get(record["id"], {})
            out.append({**now, **record, "state": record["state"]})
        return out

    async def drain(self, name: str) -> dict:
        view = self.workers.get(name)
        if view is None or view.state in GONE:
            raise SessionNotFound(f"no running worker {name!r}")
        status = await self.on_worker(view, "drain")
        await self._answered(view, status, time.monotonic())
        return view.describe()

    async def wait_for(self, predicate, timeout: float) -> bool:
        """Wait until `predicate(pool)` holds (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return True


POOL = web.AppKey("facecast-pool", WorkerPool)


def _ray_error(exc: BaseException) -> bool:
    """An actor call failed in Ray (its actor died, restarts or cannot be reached)."""
    from ray.exceptions import RayActorError

    return isinstance(exc, RayActorError)


def _actor_died(exc: BaseException) -> bool:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(exc, (ActorDiedError, RayActorError)) and not isinstance(
        exc, ActorUnavailableError
    )


def _quiet(future: asyncio.Future) -> asyncio.Future:
    """A future whose failure is read by whoever waits on it, or by nobody: a worker that
    died with a call outstanding must not log 'exception was never retrieved'."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


def _actor_id(handle: Any) -> str:
    return handle._actor_id.hex()  # Ray's own id: tells a recreated actor from the ended one


def _death_cause(exc: BaseException) -> str:
    """Ray's own sentence on why an actor died (its process, its node), else its first."""
    lines = [line.strip() for line in str(exc).splitlines()]
    cause = next((line for line in lines if line.startswith("The actor is dead because")), "")
    return (cause.split(" Worker exit")[0] or _first_line(exc)).rstrip(".")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
