"""A fleet worker: one Ray actor, one engine, the WebRTC peers of its sessions.

The worker is the server without its HTTP listener: it builds the same app
(`realtime.server.build_app`, so the same `Service`, KVS mirrors and session machinery),
starts its engine the way `facecast serve` does (`Service.start_engine`: load, compile,
warm-up) and negotiates offers with `realtime.server.open_session`. Media flows between
the caller and this worker's node; the front only relays the SDP. KVS mirrors run here,
beside their session.

The actor is asynchronous: every method runs on one event loop in the actor's process,
the loop aiortc and the sessions live on; the engine works in its own thread or process,
as in `serve`. Failures a caller should hear about come back as values
(`fleet/answers.py`), never as Ray exceptions, so the front can answer them as the
server would. Each session's opening and end are written to the registry
(`fleet/registry.py`), and every `SYNC_INTERVAL_S` the worker sends it the whole of what it
hosts (`sync`): a registry that Ray restarted empty has the live sessions back within that,
and a report the registry missed (it was down) is made good.

Beside /offer the worker answers what the front relays for its sessions: WHIP and WHEP
signalling (the routes' own functions, `realtime.whip` and `realtime.whep`, on this
worker's app) and the speech socket's channel (`fleet/speech_channels.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web
from aiortc import RTCSessionDescription

from pipeline.startup import EngineOptions
from realtime.errors import EngineStarting, RealtimeError, ServerFull, SessionNotFound
from realtime.fleet.answers import failure
from realtime.fleet.speech_channels import SpeechChannels
from realtime.negotiation import open_session
from realtime.offer import OfferRequest
from realtime.server import build_app, metrics_text
from realtime.service import SERVICE, ServerConfig, Service, close_service
from realtime.session import PeerSession
from realtime.whep import add_whep_viewer, check_whep_resource, close_whep_viewer, find_viewer
from realtime.whip import add_fragment, close_whip_session, open_whip_session, whip_session

log = logging.getLogger(__name__)
REGISTRY_TIMEOUT_S = 5.0
SYNC_INTERVAL_S = 2.0  # how often the registry is sent all this worker hosts


class FleetWorker:
    """Ray turns this into the worker actor (`worker_actor`); plain Python otherwise, so it
    can also be driven directly (bench/fleet_worker_gpu.py)."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        engine_options: EngineOptions,
        reference: bytes | None = None,
        registry: Any = None,
    ) -> None:
        self.name = name
        self.incarnation = secrets.token_hex(6)  # a restarted actor is a new incarnation
        self.registry = registry  # the registry actor's handle; None: nothing is recorded
        self.engine_options = engine_options
        self.config = config
        if reference is not None:  # the front's --reference, so no node needs the file
            path = Path(tempfile.mkdtemp(prefix="facecast-ref-")) / "reference"
            path.write_bytes(reference)
            self.config = replace(config, reference=str(path))
        self.node_id, self.node_ip, self.gpu_ids = _node()
        self.draining = False
        self.recently_closed: deque[dict] = deque(maxlen=50)
        self.speech = SpeechChannels()
        self._app: web.Application | None = None
        self._service: Service | None = None
        self._start: asyncio.Task | None = None
        self._sync: asyncio.Task | None = None

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> dict:
        """Start the engine (once; later calls wait for the same start); returns status."""
        if self._start is None:
            loop = asyncio.get_running_loop()
            self._start = loop.create_task(self._start_engine())
            if self.registry is not None:
                self._sync = loop.create_task(self._sync_registry(), name="registry-sync")
        await asyncio.shield(self._start)
        return self.status()

    async def _start_engine(self) -> None:
        app = self._app = build_app(self.config, engine=None)  # never listened on
        service = self._service = app[SERVICE]
        service.close_listeners.append(self._session_closed)
        await service.start_engine(self.engine_options, self.config.engine_process)
        if service.engine is not None:
            log.info("worker %s: engine ready in %.1f s", self.name, service.startup_seconds)

    def status(self) -> dict:
        """What the front places by: state, slots, sessions, where this worker runs."""
        service = self._service
        state = "new" if self._start is None else service.state if service else "starting"
        sessions: list[str] = list(service.sessions) if service else []
        reserved = service.reserved if service else 0
        body = {
            "name": self.name,
            "incarnation": self.incarnation,
            "state": state,
            "draining": self.draining,
            "max_sessions": service.max_sessions if service else self.config.max_sessions or 1,
            "sessions": sessions,
            "reserved": reserved,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "gpu_ids": self.gpu_ids,  # the GPUs Ray gave this worker (CUDA_VISIBLE_DEVICES)
            "pid": os.getpid(),
        }
        if service is not None and service.startup_error:
            body["error"] = service.startup_error
        if service is not None and service.engine is not None:
            body["startup_seconds"] = round(service.startup_seconds, 3)
        return body

    def drain(self) -> dict:
        """Take no new session; the ones running finish (the front ends the actor after)."""
        self.draining = True
        log.info("worker %s: draining (%d sessions left)", self.name, len(self._sessions()))
        return self.status()

    async def shutdown(self, reason: str = "worker shutting down") -> None:
        if self._sync is not None:
            self._sync.cancel()
        if self._service is not None:
            await close_service(self._service, reason)

    # ---- sessions --------------------------------------------------------------------

    async def offer(
        self,
        sdp: str,
        seed: int = 0,
        kvs_stream: str | None = None,
        photo: Any = None,
        prompt: str | None = None,
    ) -> dict:
        """Negotiate one offer (already checked by the front); the answer and where it runs.
        `photo`: the session's own photo, checked and prepared by the front (a
        `PreparedPhoto`, fleet/photos.py); None for this worker's reference. `prompt`: the
        session's own words, for a model that reads them; None for the worker's."""
        description = RTCSessionDescription(sdp=sdp, type="offer")
        request = OfferRequest(description, seed, kvs_stream, photo, prompt)
        return await self._open(lambda service: open_session(service, request))

    async def whip_offer(self, sdp: str) -> dict:
        """A WHIP offer (POST /whip on the front), opened as the server's route opens it."""
        return await self._open(lambda service: open_whip_session(self._ready_app(), sdp.encode()))

    async def _open(self, negotiate: Callable[[Service], Awaitable[PeerSession]]) -> dict:
        try:
            if self.draining:
                raise ServerFull(f"worker {self.name} is draining")
            session = await negotiate(self._ready_service())
        except RealtimeError as exc:
            return failure(exc)
        record = self._where(session)
        await self._record("opened", record)
        answer = session.pc.localDescription
        return {"sdp": answer.sdp, "type": answer.type, "session_id": session.id, **record}

    async def interrupt(self, session_id: str) -> dict:
        try:
            return {"played_ms": self._session(session_id).interrupt()}
        except RealtimeError as exc:
            return failure(exc)

    async def close_session(self, session_id: str, reason: str = "deleted by the API") -> dict:
        try:
            session = self._session(session_id)
        except RealtimeError as exc:
            return failure(exc)
        await session.close(reason)
        return {"closed": session_id}

    # ---- what the front relays: WHIP and WHEP signalling, the speech socket ----------

    async def whip_close(self, session_id: str) -> dict:
        return await _answer(lambda: close_whip_session(self._ready_app(), session_id))

    async def whip_trickle(self, session_id: str, fragment: str) -> dict:
        async def trickle() -> dict:
            await add_fragment(whip_session(self._ready_app(), session_id).pc, fragment)
            return {}

        return await _answer(trickle)

    async def whep_offer(self, session_id: str, sdp: str) -> dict:
        """A viewer of `session_id` (POST /whep/{id} on the front): its answer and Location."""

        async def add() -> dict:
            viewer = await add_whep_viewer(self._ready_app(), session_id, sdp.encode())
            return {"sdp": viewer.pc.localDescription.sdp, "location": viewer.location}

        return await _answer(add)

    async def whep_close(self, session_id: str, viewer_id: str) -> dict:
        return await _answer(lambda: close_whep_viewer(self._ready_app(), session_id, viewer_id))

    async def whep_trickle(self, session_id: str, viewer_id: str, fragment: str) -> dict:
        async def trickle() -> dict:
            viewer = find_viewer(self._ready_app(), session_id, viewer_id)
            await add_fragment(viewer.pc, fragment)
            return {}

        return await _answer(trickle)

    async def whep_check(self, session_id: str, viewer_id: str | None) -> dict:
        async def check() -> dict:
            check_whep_resource(self._ready_app(), session_id, viewer_id)
            return {}

        return await _answer(check)

    async def speech_open(self, session_id: str) -> dict:
        """A channel for a speech socket the front holds for `session_id`."""
        try:
            return {"channel": self.speech.open(self._session(session_id))}
        except RealtimeError as exc:
            return failure(exc)

    async def speech_send(self, channel_id: str, messages: list[str | bytes]) -> dict:
        try:
            self.speech.send(channel_id, messages)
        except RealtimeError as exc:
            return failure(exc)
        return {}

    async def speech_events(self, channel_id: str, wait_s: float) -> dict:
        try:
            return await self.speech.events(channel_id, wait_s)
        except RealtimeError as exc:
            return failure(exc)

    async def speech_close(self, channel_id: str) -> dict:
        self.speech.close(channel_id)
        return {}

    def describe_sessions(self) -> list[dict]:
        service = self._service
        return [service.describe(s) for s in self._sessions().values()] if service else []

    async def metrics(self) -> bytes:
        if self._service is None:
            return b""
        return await metrics_text(self._service)

    # ---- internals -------------------------------------------------------------------

    def _sessions(self) -> dict[str, PeerSession]:
        return self._service.sessions if self._service is not None else {}

    def _ready_service(self) -> Service:
        service = self._service
        if service is None or service.engine is None:
            why = service.startup_error if service is not None else None
            raise EngineStarting(f"worker {self.name}: " + (why or "the engine is starting"))
        return service

    def _ready_app(self) -> web.Application:
        self._ready_service()
        assert self._app is not None  # made with the service
        return self._app

    def _where(self, session: PeerSession) -> dict:
        """The registry's record of one of this worker's sessions."""
        return {
            "id": session.id,
            "worker": self.name,
            "incarnation": self.incarnation,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "created": round(session.created, 3),
        }

    def _session(self, session_id: str) -> PeerSession:
        session = self._sessions().get(session_id)
        if session is None:
            raise SessionNotFound(f"no live session {session_id!r} on worker {self.name}")
        return session

    async def _session_closed(self, session: PeerSession) -> None:
        final = {
            "closed_reason": session.close_reason,
            **{k: v for k, v in session.stats().items() if k in FINAL_STATS},
        }
        closed_at = round(time.time(), 3)
        self.recently_closed.append({**self._where(session), **final, "closed_at": closed_at})
        await self._record("closed", session.id, session.close_reason, final)
        if self.draining and not self._sessions():
            log.info("worker %s: drained", self.name)

    async def _record(self, method: str, *args: object) -> None:
        """Tell the registry; a slow or lost registry never holds a session up."""
        if self.registry is None:
            return
        try:
            ref = getattr(self.registry, method).remote(*args)
            await asyncio.wait_for(asyncio.wrap_future(ref.future()), REGISTRY_TIMEOUT_S)
        except Exception as exc:
            log.warning("worker %s: registry %s failed: %s", self.name, method, exc)

    async def _sync_registry(self) -> None:
        """Send the registry all this worker hosts, every SYNC_INTERVAL_S. The snapshot
        and its sending happen in one step of the loop, so the registry sees it in order
        with this worker's `opened` and `closed` reports."""
        failing = False
        while True:
            await asyncio.sleep(SYNC_INTERVAL_S)
            live = [self._where(s) for s in self._sessions().values()]
            try:
                ref = self.registry.sync.remote(
                    self.name, self.incarnation, live, list(self.recently_closed)
                )
                await asyncio.wait_for(asyncio.wrap_future(ref.future()), REGISTRY_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # down or restarting: the next sync tries again
                if not failing:
                    log.warning("worker %s: registry sync failed: %s", self.name, exc)
                failing = True
                continue
            if failing:
                log.info("worker %s: registry sync works again", self.name)
            failing = False


async def _answer(work: Callable[[], Awaitable[dict]]) -> dict:
    try:
        return await work()
    except RealtimeError as exc:
        return failure(exc)


FINAL_STATS = ("frames_sent", "frames_fresh", "fresh_share", "ttff_ms")


def _node() -> tuple[str | None, str | None, list[str]]:
    """The Ray node this runs on and the GPUs it was given (None, None, [] outside Ray:
    driven directly)."""
    try:
        import ray
    except ImportError:
        return None, None, []
    if not ray.is_initialized():
        return None, None, []
    context = ray.get_runtime_context()
    gpus = [str(g) for g in context.get_accelerator_ids().get("GPU", [])]
    return context.get_node_id(), ray.util.get_node_ip_address(), gpus


def worker_actor(name: str, namespace: str, placement: dict, restarts: int):
    """The Ray actor class of worker `name`, placed by `placement` (`worker_resources`).
    Named and detached: any front finds it, and it outlives the front that made it."""
    import ray

    return ray.remote(FleetWorker).options(
        name=name,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=restarts,
        max_concurrency=1000,  # an async actor: calls interleave on its one event loop
        **placement,
    )
