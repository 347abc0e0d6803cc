"""One server's engine and sessions: `Service`, stored on the app under `SERVICE`.

It owns the hosted engine (`realtime.engine_host`), the live sessions, the photo uploads
and the metrics. Opening a session from an offer is `realtime.negotiation`; the offer's
checks are `realtime.offer`; the routes live in `realtime.server`, `realtime.whip`,
`realtime.whep` and `realtime.speech_ws`; this module imports none of them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from aiortc import RTCIceServer

from pipeline.clock import FPS
from pipeline.startup import EngineOptions, freeze_long_lived_objects
from pipeline.stream import AvatarStream, Reference, StreamingEngine
from realtime.engine_host import HostedEngine, InProcessEngine, host_engine
from realtime.engine_timing import EngineTiming
from realtime.errors import EngineStarting, SessionNotFound
from realtime.kvs import KvsOptions
from realtime.metrics import RealtimeMetrics
from realtime.photos import PhotoStore
from realtime.reference import load_reference
from realtime.security import SecurityConfig
from realtime.session import PeerSession
from realtime.session_config import SessionConfig
from realtime.sinks import SinkFactory
from realtime.stagger import StepCycle

log = logging.getLogger(__name__)

DEFAULT_MAX_SESSIONS = 4  # an engine that measures no capacity (the CPU demo, integrations)


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    # concurrent sessions; None: as many as the engine measured it carries at real time
    # (`HostedEngine.capacity`, at least 1), DEFAULT_MAX_SESSIONS where it measures none
    max_sessions: int | None = None
    # plan every call's playout as if this many calls shared the engine (None: the calls
    # live at the time): a GPU kept full of N calls gives each the delay it will need from
    # its first frame, so a started call drops no frames when another joins (a call planned
    # alone raises its delay only at its peer's next pause, and shows late frames until then)
    plan_sessions: int | None = None
    token: str | None = None
    reference: str | None = None  # image file; default: the engine's packaged reference
    # the reference's face framed by hand (photo stack, real models): x, y, w, h[, angle]
    # in its pixels
    face_box: tuple[float, ...] | None = None
    # `serve`: the engine in its own process (None: on a CPU, where it measured 35-50%
    # faster steps beside the media loop; not on a GPU, where the frames' trip through
    # shared memory cost 0.07-0.14 s a 720p step and in-process steps matched bench)
    engine_process: bool | None = None
    max_body_bytes: int = 64 * 1024  # an SDP offer is a few KiB
    session: SessionConfig = field(default_factory=SessionConfig)
    kvs: KvsOptions | None = None  # mirror every session to Kinesis Video Streams
    ice_servers: list[RTCIceServer] = field(default_factory=list)  # advertised to WHIP/WHEP
    # STUN/TURN the server's own peers gather candidates with (a fleet worker behind NAT);
    # none by default: on loopback and a LAN, host candidates are all there is to find
    peer_ice_servers: list[RTCIceServer] = field(default_factory=list)
    max_viewers: int = 16  # WHEP viewers per session (realtime/whep/)
    security: SecurityConfig = field(default_factory=SecurityConfig)  # same-origin, timeouts


class Service:
    """Everything one app instance owns: engine, sessions, metrics. Stored on the app."""

    def __init__(
        self,
        config: ServerConfig,
        engine: StreamingEngine | None,
        sink_factories: Sequence[SinkFactory] = (),
    ) -> None:
        """`engine`: one already started in this process (None: `start_engine` later)."""
        self.config = config
        self.engine: HostedEngine | None = None  # None until it is warm
        self.startup_error: str | None = None
        self.startup_began = time.monotonic()
        self.startup_phase = "starting"  # the part of start-up under way (/healthz)
        self.sink_factories = list(sink_factories)
        self.metrics = RealtimeMetrics()
        self.cycle: StepCycle | None = None  # the calls' places in the engine's steps
        if engine is not None:
            self._mark_ready(InProcessEngine(engine))
        self.sessions: dict[str, PeerSession] = {}
        # awaited after a session has closed (a fleet worker reports it to the cluster)
        self.close_listeners: list[Callable[[PeerSession], Awaitable[None]]] = []
        self.reserved = 0  # offers being negotiated count against capacity
        self.engine_lock = threading.Lock()  # one generate_ready() at a time per engine
        self.reference: Reference | None = None  # the server's identity (load_reference below)
        self.photos = PhotoStore()  # the page's uploads (realtime/photos.py)
        # more of each session in GET /sessions, e.g. its WHEP viewers (realtime/whep/)
        self.describers: list[Callable[[PeerSession], dict]] = []

    @property
    def state(self) -> str:
        if self.engine is not None:
            return "ok"
        return "failed" if self.startup_error else "starting"

    async def start_engine(self, options: EngineOptions, own_process: bool | None = None) -> None:
        """Start the engine off the event loop, in a process of its own unless told not to
        (`realtime.engine_host`); sessions are refused until it is warm."""
        try:
            engine = await asyncio.to_thread(host_engine, options, own_process, self._starting)
        except Exception as exc:  # reported by /healthz and by `serve`, which then exits
            self.startup_error = f"{type(exc).__name__}: {exc}"
            log.error("engine start-up failed: %s", self.startup_error)
            return
        self._starting("preparing the reference")
        await asyncio.to_thread(self._prepare_reference, engine)
        self._mark_ready(engine)

    def _starting(self, phase: str) -> None:
        """Start-up's progress (from the engine's thread or its process's pipe)."""
        self.startup_phase = phase

    def _prepare_reference(self, engine: HostedEngine) -> None:
        """The server's reference loaded, framed and once through the engine before the
        first call, so that neither is in that call's first frame (FlashHead Pro keeps the
        reference's latents: ~0.2 s of its first step on the H200). Where it fails, the
        first call meets the same error, as it would have."""
        try:
            self.reference = load_reference(self.config.reference, engine.cfg, self.config.face_box)
            engine.new_stream(self.reference, seed=0).close()
        except Exception as exc:
            log.warning("the reference could not be prepared before the first call: %s", exc)
            self.reference = None

    def _mark_ready(self, engine: HostedEngine) -> None:
        report = engine.startup
        seconds = report.seconds if report is not None else 0.0
        self.startup_seconds = seconds
        self.metrics.startup_seconds.set(seconds)
        self.metrics.ready.set(1)
        self.cycle = self._step_cycle(engine)
        self.engine = engine
        freeze_long_lived_objects()  # no full collection walks the model mid-call

    @property
    def max_sessions(self) -> int:
        """Sessions admitted at once: the operator's limit, else the engine's capacity."""
        if self.config.max_sessions is not None:
            return self.config.max_sessions
        capacity = self.engine.capacity if self.engine is not None else None
        return capacity or DEFAULT_MAX_SESSIONS

    def sessions_to_plan_for(self, live: int) -> int:
        """How many calls a call's playout is planned for, `live` of them sharing the engine
        now (or about to): the operator's `plan_sessions` where that is more."""
        return max(live, self.config.plan_sessions or 0)

    @property
    def engine_lock_for_sessions(self) -> threading.Lock | None:
        """The lock every session's steps take in turn; None for an engine that batches
        its sessions' steps itself (each worker then hands its step in at once)."""
        if self.engine is not None and self.engine.batches_steps:
            return None
        return self.engine_lock

    def warm_engine(self) -> HostedEngine:
        if self.engine is None:
            raise EngineStarting("the engine is starting; try again shortly")
        return self.engine

    def describe(self, session: PeerSession) -> dict:
        out = session.describe()
        for describe in self.describers:
            out.update(describe(session))
        return out

    def video_size(self) -> tuple[int, int]:
        video = self.warm_engine().cfg.video
        return int(video.width), int(video.height)

    def open_engine_stream(
        self, seed: int, photo: Reference | None = None, prompt: str | None = None
    ) -> AvatarStream:
        """An engine stream of the server's reference, or of the offer's own photo; with
        the offer's prompt, for a model that reads one (None: the server's)."""
        engine = self.warm_engine()
        if photo is None and self.reference is None:
            self.reference = load_reference(self.config.reference, engine.cfg, self.config.face_box)
        reference = photo if photo is not None else self.reference
        assert reference is not None
        if prompt is None:  # the keyword only when given: engines of integrations may lack it
            return engine.new_stream(reference, seed=seed)
        return engine.new_stream(reference, seed=seed, prompt=prompt)

    def _step_cycle(self, engine: HostedEngine) -> StepCycle:
        """Where the calls' steps fall in the engine's cycle (`realtime.stagger`). A call
        placed apart from the others plans on a step of its own and what it waits for
        theirs; where they line up (an agent's pushed audio), every call plans on the step
        of a batch of all of them, a longer delay (its first frame later if none is shown
        yet, else reached at its peer's next pause)."""
        own = engine.own_process

        def shared(calls: int) -> EngineTiming:
            planned = self.sessions_to_plan_for(calls)
            return EngineTiming.of(engine, own, sessions=planned, sharing=calls)

        plan = self.config.plan_sessions
        floor = None
        if plan is not None and plan > 1:
            floor = EngineTiming.of(engine, own, sessions=plan, sharing=1)
        period = engine.stream_step(1).frames / FPS
        return StepCycle(period, EngineTiming.of(engine, own), shared, floor)

    async def on_session_closed(self, session: PeerSession) -> None:
        if self.sessions.pop(session.id, None) is not None:
            self.metrics.active_sessions.set(len(self.sessions))
        for listener in self.close_listeners:
            try:
                await listener(session)
            except Exception:
                log.exception("session %s: close listener %r failed", session.id, listener)


SERVICE = web.AppKey("facecast", Service)


CONFIG = web.AppKey("facecast-config", ServerConfig)


def require_engine(service: Service) -> None:
    """Offers wait for a warm engine: 503 while it starts (POST /offer and POST /whip)."""
    if service.engine is None:
        if service.startup_error:
            raise EngineStarting(f"the engine failed to start: {service.startup_error}")
        waited = time.monotonic() - service.startup_began
        raise EngineStarting(
            f"the engine is still starting ({waited:.0f} s so far); retry when /healthz is ok"
        )


def session_from_request(request: web.Request) -> PeerSession:
    sid = request.match_info["id"]
    session = request.app[SERVICE].sessions.get(sid)
    if session is None:
        raise SessionNotFound(f"no live session {sid!r}")
    return session


async def close_service(service: Service, reason: str = "server shutting down") -> None:
    """End every session, then the engine (its process, if it has one)."""
    sessions = list(service.sessions.values())
    await asyncio.gather(*(s.close(reason) for s in sessions), return_exceptions=True)
    if service.engine is not None:
        await asyncio.to_thread(service.engine.close)
