"""What a fleet front relays to a session's worker (WHIP, WHEP, the speech WebSocket), what
callers get when that worker is dead or silent, and a session registry that Ray restarts.

The first test needs no cluster: its workers and registry are stand-ins that never answer
or answer with Ray's own errors, so every timeout path is exercised in seconds. The others
run a real front with real workers on a loopback cluster (`support.fleet`), and clients
that know only the RFCs (WHIP, WHEP) or the speech socket's messages.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack, MediaStreamError
from support.photos import PORTRAIT, write_bad_photos
from support.realtime import RATE, espeak, make_offer, wait_until, whip_publish
from support.whep import whep_watch

from facecast_client import SpeechSocket
from pipeline.startup import EngineOptions
from realtime.fleet.options import FleetOptions
from realtime.ice_servers import link_header, parse_ice_server
from realtime.service import ServerConfig
from realtime.whip import TRICKLE_TYPE

ray = pytest.importorskip("ray")  # the `test` extra pulls in `fleet`: present in CI

from ray.exceptions import ActorDiedError, RayActorError  # noqa: E402
from support.fleet import (  # noqa: E402
    connect,
    get_json,
    loopback_cluster,
    ready,
    running_front,
    session_of,
)

from realtime.fleet import speech_relay as fleet_speech  # noqa: E402
from realtime.fleet.front import build_front_app  # noqa: E402
from realtime.fleet.pool import WorkerPool, WorkerView  # noqa: E402
from realtime.fleet.registry import REGISTRY  # noqa: E402

SDP = {"Content-Type": "application/sdp"}
TRICKLE = {"Content-Type": TRICKLE_TYPE}


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster() as c:
        yield c


# ---- stand-ins for Ray actors ----------------------------------------------------------

NEVER = object()  # a call that is never answered


class _Ref:
    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future

    def future(self) -> concurrent.futures.Future:
        return self._future


class _Method:
    def __init__(self, answer: Callable) -> None:
        self._answer = answer

    def remote(self, *args: object) -> _Ref:
        future: concurrent.futures.Future = concurrent.futures.Future()
        outcome = self._answer(*args)
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        elif outcome is not NEVER:
            future.set_result(outcome)
        return _Ref(future)


class FakeActor:
    """Answers `method.remote(...)` as `methods[method](...)` does; others as `default`."""

    def __init__(self, default: object = NEVER, **methods: Callable) -> None:
        self._default = default
        self._methods = methods

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._methods.get(name, lambda *args: self._default))


@contextlib.asynccontextmanager
async def serving(app):
    from aiohttp import web

    from realtime.edge import FacecastRunner

    runner = FacecastRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


async def timed(http, method: str, url: str, **kw) -> tuple[int, dict, float]:
    began = time.monotonic()
    async with http.request(method, url, **kw) as r:
        return r.status, await r.json(), time.monotonic() - began


@pytest.mark.timeout(60)
async def test_a_dead_or_silent_worker_is_a_json_503_within_the_timeout(monkeypatch):
    monkeypatch.setattr(fleet_speech, "POLL_S", 0.2)
    timeout = 0.3
    options = FleetOptions(call_timeout_s=timeout, offer_timeout_s=timeout)
    pool = WorkerPool(options, ServerConfig(), EngineOptions(config="tiny"), "cpu")

    async def fence(view, no_restart: bool) -> None:  # ray.kill would start a local Ray
        fenced.append(view.name)

    fenced: list[str] = []
    monkeypatch.setattr(pool, "_kill", fence)
    status = {"max_sessions": 1, "sessions": [], "reserved": 0, "draining": False}
    channel = {"speech_open": lambda sid: {"channel": "c1"}, "speech_send": lambda *a: {}}
    actors = {
        "w-dead": FakeActor(ActorDiedError()),
        "w-silent": FakeActor(),
        "w-stalls": FakeActor(**channel),  # opens a speech channel, then answers nothing
        "w-dies": FakeActor(ActorDiedError(), **channel),  # … then is gone
    }
    for name, actor in actors.items():
        pool.workers[name] = WorkerView(name, actor, state="ok", status=dict(status))
    pool.workers["w-stalls"].status["max_sessions"] = 0  # no offer goes there
    pool.workers["w-dies"].status["max_sessions"] = 0

    def lookup(sid: str) -> dict:  # session "on-X" runs on worker "w-X"
        return {"id": sid, "worker": "w-" + sid.removeprefix("on-"), "state": "live"}

    pool.registry = FakeActor(lookup=lookup, worker_lost=lambda *a: [])
    turn = parse_ice_server("turn:user:pass@turn.example.net:3478?transport=udp")
    config = ServerConfig(port=0, ice_servers=[turn])
    async with serving(build_front_app(config, pool)) as url:
        async with aiohttp.ClientSession() as http:
            status_, body, took = await timed(http, "DELETE", f"{url}/whip/on-dead")
            assert status_ == 503 and body["error"] == "worker w-dead is gone", body
            assert took < 1.0  # at once: Ray said so, no timeout was waited for

            for method, path, kw in (
                ("DELETE", "/whip/on-silent", {}),
                ("PATCH", "/whip/on-silent", {"data": "a=end-of-candidates\r\n", "headers": TRICKLE}),
                ("DELETE", "/whep/on-silent/v1", {}),
                ("OPTIONS", "/whep/on-silent", {}),
                ("POST", "/whep/on-silent", {"data": await recvonly_offer(), "headers": SDP}),
                ("GET", "/sessions/on-silent/speech", {}),  # refused before the upgrade
            ):  # fmt: skip
                status_, body, took = await timed(http, method, url + path, **kw)
                assert status_ == 503, (method, path, body)
                assert body["error"] == f"worker w-silent did not answer within {timeout:g} s"
                assert timeout <= took < timeout + 1.0, (method, path, took)
            # what the front refuses by itself still comes first
            patch = {"data": "", "headers": {**TRICKLE, "If-Match": "*"}}
            status_, body, _ = await timed(http, "PATCH", f"{url}/whip/on-silent", **patch)
            assert status_ == 422 and "ICE restart" in body["error"]

        silent = SpeechSocket(url, "on-silent")
        with pytest.raises(ConnectionError, match=r"\(503\)"):
            await silent.connect()
        for worker, why in (
            ("stalls", f"did not answer within {0.2 + timeout:g} s"),
            ("dies", "is gone"),
        ):
            sock = SpeechSocket(url, f"on-{worker}")
            await sock.connect()
            began = time.monotonic()
            error = await sock.wait_event("error", timeout=5)
            assert f"worker w-{worker} {why}" in error["message"], error
            assert time.monotonic() - began < 2.0
            await wait_until(lambda s=sock: s.closed, 2.0, interval=0.02)
            assert sock._ws.close_code == aiohttp.WSCloseCode.INTERNAL_ERROR
            await sock.close()

        async with aiohttp.ClientSession() as http:
            # the registry: silent, then restarting (the call in flight is lost once)
            pool.registry = FakeActor()
            status_, body, took = await timed(http, "GET", f"{url}/sessions")
            assert status_ == 503, body
            assert body["error"] == f"the session registry did not answer within {timeout:g} s"
            lost = iter([RayActorError()])
            pool.registry = FakeActor(list=lambda: next(lost, []))
            for name in list(pool.workers):  # nobody to ask for live stats
                pool.workers[name].state = "drained"
            status_, body, _ = await timed(http, "GET", f"{url}/sessions")
            assert status_ == 200 and body == {"sessions": []}, body
            for name in ("w-dead", "w-silent"):
                pool.workers[name].state = "ok"

            # bad offers never reach a worker; a good one that no worker takes says why
            for data, headers, expect in (
                ("v=0", {"Content-Type": "text/plain"}, 415),
                ("hello", SDP, 400),
                (await make_offer(audio=False), SDP, 400),
            ):
                status_, body, _ = await timed(
                    http, "POST", f"{url}/whip", data=data, headers=headers
                )
                assert status_ == expect, body
            status_, body, took = await timed(
                http, "POST", f"{url}/whip", data=await make_offer(), headers=SDP
            )
            assert status_ == 503, body
            assert "worker w-dead is gone" in body["error"], body
            assert f"worker w-silent did not answer within {timeout:g} s" in body["error"]
            assert took < 4 * timeout + 1.0
            assert fenced == ["w-dead"]  # found dead by the fresh look the offer took

            # a worker that takes it: its answer, the front's Location and ICE servers
            answer = {"sdp": "v=0\r\n", "session_id": "s1", "worker": "w-ok"}
            pool.workers["w-ok"] = WorkerView(
                "w-ok", FakeActor(whip_offer=lambda sdp: answer), state="ok", status=dict(status)
            )
            async with http.post(f"{url}/whip", data=await make_offer(), headers=SDP) as r:
                assert r.status == 201 and await r.text() == "v=0\r\n"
                assert r.headers["Location"] == "/whip/s1"
                assert r.headers.getall("Link") == link_header(turn)
    assert not ray.is_initialized()


@pytest.mark.timeout(60)
async def test_the_fronts_photo_routes_keep_photos_in_the_registry_and_send_them_along():
    """No cluster: stand-ins for the registry (a real SessionRegistry's table) and a worker
    that notes what its `offer` was given."""
    from realtime.fleet.registry import SessionRegistry

    timeout = 0.3
    options = FleetOptions(call_timeout_s=timeout, offer_timeout_s=timeout)
    pool = WorkerPool(options, ServerConfig(), EngineOptions(config="photo"), "cpu")
    table = SessionRegistry()
    pool.registry = FakeActor(add_photo=table.add_photo, photo=table.photo)
    given: list[tuple] = []

    def offer(*args: object) -> dict:
        given.append(args)
        where = {"worker": "w-ok", "node_id": "n1", "node_ip": "127.0.0.1"}
        return {"sdp": "v=0\r\n", "type": "answer", "session_id": "s1", **where}

    status = {"max_sessions": 4, "sessions": [], "reserved": 0, "draining": False}
    pool.workers["w-ok"] = WorkerView("w-ok", FakeActor(offer=offer), state="ok", status=status)
    config = ServerConfig(port=0, token="secret")
    auth = {"Authorization": "Bearer secret"}
    async with serving(build_front_app(config, pool)) as url, aiohttp.ClientSession() as http:
        jpeg = {"Content-Type": "image/jpeg", **auth}
        async with http.post(f"{url}/photos", data=PORTRAIT.read_bytes()) as r:
            assert r.status == 401, await r.json()  # the front's token, as on every route
        async with http.post(f"{url}/photos", data=PORTRAIT.read_bytes(), headers=jpeg) as r:
            up = r.status, await r.json()
        async with http.post(f"{url}/photos", data=b"hello" * 20, headers=jpeg) as r:
            not_image = r.status, await r.json()
        sdp = await make_offer()
        answers = []
        for extra in ({"photo_id": up[1]["photo_id"]}, {"photo_id": "nope"}, {"photo": "!"}):
            body = {"sdp": sdp, "type": "offer", **extra}
            async with http.post(f"{url}/offer", json=body, headers=auth) as r:
                answers.append((r.status, await r.json()))
        pool.registry = FakeActor()  # silent: the upload is a 503 within the timeout
        status_, silent, took = await timed(
            http, "POST", f"{url}/photos", data=PORTRAIT.read_bytes(), headers=jpeg
        )

    assert up[0] == 201 and len(up[1]["face"]) == 4, up
    assert not_image[0] == 415 and "not a PNG, JPEG or WebP" in not_image[1]["error"]
    assert answers[0][0] == 200 and answers[0][1]["session_id"] == "s1", answers
    assert answers[1][0] == 400 and "unknown photo_id 'nope'" in answers[1][1]["error"]
    assert answers[2][0] == 400 and "base64" in answers[2][1]["error"]
    assert len(given) == 1  # refused offers never reach a worker
    photo = given[0][3]
    assert photo is table.photo(up[1]["photo_id"]) and photo.framed.shape == (256, 256, 3)
    assert status_ == 503 and "registry did not answer" in silent["error"], silent
    assert took < timeout + 2.0, took  # the face search, then at most the call timeout
    assert not ray.is_initialized()


def test_the_fronts_photos_are_checked_for_the_real_model_its_workers_run():
    """`serve --cluster ray --model flashhead-pro`: the front frames uploads for the model's
    config (a 512-px square), not for the default preset that --config leaves beside it."""
    from aiohttp import web

    from realtime.fleet.photos import ENGINE_CONFIG, add_photo_routes

    app = web.Application()
    add_photo_routes(app, EngineOptions(model="flashhead-pro", weights="W", wav2vec="V"))
    cfg = app[ENGINE_CONFIG]
    assert (cfg.name, cfg.video.width, cfg.flashhead.weights) == ("flashhead-pro", 512, "W")


async def recvonly_offer() -> str:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="recvonly")
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


# ---- through a real front --------------------------------------------------------------


class WhipCaller:
    """A WHIP client that also receives (audio sendrecv, video recvonly), as RFC 9725
    allows; it counts the avatar's video frames."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.frames: list[float] = []
        self.location: str | None = None
        self._tasks: list[asyncio.Task] = []
        self.pc.on(
            "track", lambda track: self._tasks.append(asyncio.ensure_future(self._drain(track)))
        )

    async def _drain(self, track) -> None:
        try:
            while True:
                await track.recv()
                if track.kind == "video":
                    self.frames.append(time.monotonic())
        except MediaStreamError:
            return

    async def publish(self, http, endpoint: str) -> tuple[int, str]:
        self.pc.addTransceiver(AudioStreamTrack(), direction="sendrecv")
        self.pc.addTransceiver("video", direction="recvonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with http.post(endpoint, data=self.pc.localDescription.sdp, headers=SDP) as r:
            status, body = r.status, await r.text()
            if status == 201:
                self.location = r.headers["Location"]
        if status == 201:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
        return status, body

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.mark.slow  # end to end: two workers start (15-30 s on 2 cores)
@pytest.mark.timeout(240)
async def test_whip_whep_and_the_speech_socket_through_the_front_and_a_dead_worker(cluster):
    pcm = espeak("Hello from a worker node.")
    async with (
        running_front("relay-media", workers=2, per_worker=1) as (url, pool),
        aiohttp.ClientSession() as http,
    ):
        await ready(pool, 2)
        caller = WhipCaller()
        status, body = await caller.publish(http, f"{url}/whip")
        assert status == 201, body
        sid = caller.location.rsplit("/", 1)[1]
        assert caller.location == f"/whip/{sid}"  # the front's resource: routed from any front
        await wait_until(lambda: len(caller.frames) >= 25, 30)  # the avatar, from its worker
        _, listed = await get_json(f"{url}/sessions")
        record = session_of(listed["sessions"], sid)
        assert record["state"] == "live" and record["node_id"], record
        worker = record["worker"]
        async with http.patch(
            f"{url}{caller.location}", data="a=end-of-candidates\r\n", headers=TRICKLE
        ) as r:
            assert r.status == 204, await r.text()

        # the other slot: a sendonly publisher, hung up with DELETE; then both are full
        other = await whip_publish(http, f"{url}/whip", AudioStreamTrack(), SDP)
        assert other.status == 201, other.body
        full = await whip_publish(http, f"{url}/whip", AudioStreamTrack(), SDP)
        assert full.status == 503 and "every worker is full" in full.body
        async with http.delete(other.location) as r:
            assert r.status == 200, await r.text()
        await other.pc.close()
        _, listed = await get_json(f"{url}/sessions")
        ended = session_of(listed["sessions"], other.location.rsplit("/", 1)[1])
        assert ended["state"] == "closed" and ended["reason"] == "ended by the WHIP client"
        assert ended["worker"] != worker

        # a WHEP viewer of the WHIP session, through the front
        async with http.options(f"{url}/whep/{sid}") as r:
            assert r.status == 200 and r.headers["Accept-Post"] == "application/sdp"
        async with http.head(f"{url}/whep/{sid}") as r:
            assert r.status == 200 and r.headers["Content-Type"] == "application/sdp"
        viewer = await whep_watch(http, f"{url}/whep/{sid}", {}, trickle=True)  # PATCHes too
        assert viewer.status == 201, viewer.body
        assert viewer.location.startswith(f"{url}/whep/{sid}/")
        await wait_until(lambda: len(viewer.video) >= 25 and len(viewer.audio) >= 50, 30)
        _, listed = await get_json(f"{url}/sessions")
        assert session_of(listed["sessions"], sid)["viewers"] == 1

        # the agent's speech socket, through the front, drives an utterance on the worker
        sock = SpeechSocket(url, sid)
        await sock.connect()
        trips = []
        for n in range(5):  # what the relay adds: a message there and an event back
            sent = time.monotonic()
            await sock.speech._out(json.dumps({"type": "ping", "t": n}))
            pong = await sock.wait_event("pong", 5, after=sent)
            assert pong["t"] == n
            trips.append(pong["_t"] - sent)
        await sock.speech.say(pcm, RATE, uid="u1")
        started = await sock.wait_event("playback_started", 30)
        finished = await sock.wait_event("playback_finished", 30)
        assert started["id"] == finished["id"] == "u1"
        assert finished["interrupted"] is False
        assert abs(finished["playback_position"] - pcm.size / RATE) < 0.001, finished
        shown = [t for _, t, _ in viewer.video if started["_t"] <= t <= finished["_t"]]
        assert len(shown) >= 0.6 * 25 * (finished["_t"] - started["_t"]), "the viewer watched it"

        async with http.delete(viewer.location) as r:
            assert r.status == 200, await r.text()
        _, listed = await get_json(f"{url}/sessions")
        assert session_of(listed["sessions"], sid)["viewers"] == 0
        await viewer.close()

        # the session's worker dies: its socket says so at once, and its URLs answer fast
        killed = time.monotonic()
        os.kill(pool.workers[worker].status["pid"], signal.SIGKILL)
        error = await sock.wait_event("error", timeout=10, after=killed)
        told = time.monotonic() - killed
        assert f"worker {worker}" in error["message"], error
        await wait_until(lambda: sock.closed, 5.0, interval=0.02)
        await sock.close()
        for method, path, kw in (
            ("POST", f"/whep/{sid}", {"data": await recvonly_offer(), "headers": SDP}),
            ("DELETE", caller.location, {}),
        ):
            status, body, took = await timed(http, method, url + path, **kw)
            assert status in (404, 503) and worker in body["error"], (method, body)
            assert took < 2.0, (method, took)
        await caller.close()
    print(
        f"fleet relay: ping -> pong through the front {1000 * min(trips):.1f}-"
        f"{1000 * max(trips):.1f} ms; a dead worker's speech socket told in {told:.2f} s",
        file=sys.stderr,
    )
    assert told < 3.0, told


@pytest.mark.slow  # end to end: a worker starts (10-20 s on 2 cores)
@pytest.mark.timeout(240)
async def test_a_restarted_registry_lists_the_live_sessions_again(cluster):
    namespace = "relay-registry"
    async with (
        running_front(namespace, workers=1, per_worker=2) as (url, pool),
        aiohttp.ClientSession() as http,
    ):
        await ready(pool, 1)
        a = await connect(url)
        gone = await whip_publish(http, f"{url}/whip", AudioStreamTrack(), SDP)
        async with http.delete(gone.location) as r:
            assert r.status == 200
        await gone.pc.close()
        b = await whip_publish(http, f"{url}/whip", AudioStreamTrack(), SDP)
        assert b.status == 201, b.body
        ids = {a.session_id, b.location.rsplit("/", 1)[1]}
        _, before = await get_json(f"{url}/sessions")

        registry = ray.get_actor(REGISTRY, namespace=namespace)
        old = await asyncio.to_thread(ray.get, registry.about.remote(), timeout=10)
        killed = time.monotonic()
        os.kill(old["pid"], signal.SIGKILL)  # Ray restarts it (max_restarts=-1), empty
        answers = []
        while True:
            status, body, took = await timed(http, "GET", f"{url}/sessions")
            answers.append((status, took))
            live = {s["id"] for s in body.get("sessions", []) if s["state"] == "live"}
            if status == 200 and ids <= live:
                break
            assert status in (200, 503), body
            assert time.monotonic() - killed < 20, answers
            await asyncio.sleep(0.2)
        recovered = time.monotonic() - killed
        new = await asyncio.to_thread(ray.get, registry.about.remote(), timeout=10)
        after = body["sessions"]

        # a second front (a new process would find the same registry and workers)
        async with running_front(namespace, workers=1, per_worker=2, end=False) as (url2, pool2):
            await ready(pool2, 1)
            _, seen = await get_json(f"{url2}/sessions")
            deleted = []
            for path in (f"/sessions/{a.session_id}", f"/whip/{b.location.rsplit('/', 1)[1]}"):
                async with http.delete(url2 + path) as r:
                    deleted.append(r.status)
        await a.close(release=False)
        await b.pc.close()

    print(f"fleet relay: registry restarted, sessions listed in {recovered:.1f} s", file=sys.stderr)
    assert new["pid"] != old["pid"] and new["started"] > old["started"], (old, new)
    assert recovered < 8.0, (recovered, answers)
    assert all(took < pool.options.call_timeout_s + 1.0 for _, took in answers), answers
    for listing in (after, seen["sessions"]):
        for sid in ids:
            was, now = session_of(before["sessions"], sid), session_of(listing, sid)
            assert now["state"] == "live", now
            assert (now["worker"], now["node_id"]) == (was["worker"], was["node_id"]), now
        # and the worker's recent history came back with it
        ended = session_of(listing, gone.location.rsplit("/", 1)[1])
        assert ended["state"] == "closed" and ended["reason"] == "ended by the WHIP client"
    assert deleted == [200, 200]  # through the second front and the restarted registry


def framed(path) -> np.ndarray:
    """A portrait framed as the photo stack's engine frames it (its rest frame)."""
    from pipeline.config import load_config
    from realtime.reference import load_reference

    return load_reference(str(path), load_config("photo")).framed.astype(np.float32)


async def upload(http, url: str, data: bytes, kind: str = "image/jpeg") -> tuple[int, dict]:
    async with http.post(f"{url}/photos", data=data, headers={"Content-Type": kind}) as r:
        return r.status, await r.json()


@pytest.mark.slow  # end to end: a photo-stack worker starts (10-20 s on 2 cores)
@pytest.mark.timeout(240)
async def test_the_pages_own_photo_through_the_front(cluster, tmp_path):
    """POST /photos on the front checks the photo as the server does; an offer naming it
    (or carrying it inline) gets a session on a worker that shows that photo."""
    import cv2

    own = PORTRAIT.parent / "astronaut.jpg"  # not the workers' default (PORTRAIT)
    small = tmp_path / "small.jpg"  # inline photos must fit the offer's 64 KiB body
    image = cv2.imread(str(own))
    cv2.imwrite(str(small), cv2.resize(image, (256, 256)), [cv2.IMWRITE_JPEG_QUALITY, 80])
    bad = write_bad_photos(tmp_path)
    refused = {"faceless": 422, "corrupt": 400, "not an image": 415, "too many bytes": 413}
    async with (
        running_front("relay-photos", workers=1, per_worker=2, engine_config="photo") as (
            url,
            pool,
        ),
        aiohttp.ClientSession() as http,
    ):
        status, shipped = await upload(http, url, PORTRAIT.read_bytes())
        assert status == 201 and shipped["photo_id"] and len(shipped["face"]) == 4, shipped
        answers = {}
        for case in refused:
            path, message = bad[case]
            answers[case] = await upload(http, url, path.read_bytes(), "image/png")
            assert message in answers[case][1]["error"], (case, answers[case])
        status, wrong_type = await upload(http, url, PORTRAIT.read_bytes(), "text/plain")
        assert status == 415 and "Content-Type" in wrong_type["error"], wrong_type
        status, mine = await upload(http, url, own.read_bytes())
        assert status == 201, mine

        offer = {"sdp": await make_offer(), "type": "offer"}
        async with http.post(f"{url}/offer", json={**offer, "photo_id": "nope"}) as r:
            unknown = r.status, await r.json()
        async with http.post(f"{url}/offer", json={**offer, "photo": "not base64!"}) as r:
            not_base64 = r.status, await r.json()

        await ready(pool, 1)
        by_id = await connect(url, keep_frames=True, offer_options={"photo_id": mine["photo_id"]})
        inline = base64.b64encode(small.read_bytes()).decode()
        by_bytes = await connect(url, keep_frames=True, offer_options={"photo": inline})
        await by_id.wait_frames(10)
        await by_bytes.wait_frames(10)
        frames = {
            "photo_id": np.stack(by_id.received.frames[:10]).astype(np.float32),
            "photo": np.stack(by_bytes.received.frames[:10]).astype(np.float32),
        }
        await by_id.close()
        await by_bytes.close()

        # a second front (another process would find the same registry and workers)
        async with running_front(
            "relay-photos", workers=1, per_worker=2, engine_config="photo", end=False
        ) as (url2, pool2):
            await ready(pool2, 1)
            elsewhere = await connect(
                url2, keep_frames=True, offer_options={"photo_id": mine["photo_id"]}
            )
            await elsewhere.wait_frames(10)
            frames["photo_id, second front"] = np.stack(elsewhere.received.frames[:10])
            await elsewhere.close()

    assert {case: status for case, (status, _) in answers.items()} == refused, answers
    assert unknown[0] == 400 and "POST /photos" in unknown[1]["error"], unknown
    assert not_base64[0] == 400 and "base64" in not_base64[1]["error"], not_base64
    wants, default = {"photo_id": framed(own), "photo": framed(small)}, framed(PORTRAIT)
    for how, got in frames.items():
        got, want = got.astype(np.float32), wants[how.split(",")[0]]
        assert got.shape[1:] == want.shape, (how, got.shape)
        # The idle motion (blinks, sway) and VP8 change a few pixels; another face, most.
        mine_diff = float(np.abs(got - want).mean())
        default_diff = float(np.abs(got - default).mean())
        print(
            f"fleet photo ({how}): {mine_diff:.1f} from it, {default_diff:.1f} from the default",
            file=sys.stderr,
        )
        assert mine_diff < 10 and mine_diff < default_diff / 5, (how, mine_diff, default_diff)


def test_a_workers_sync_refills_an_empty_registry_and_makes_good_lost_reports():
    from realtime.fleet.registry import SessionRegistry

    def rec(sid: str, worker: str = "w0", incarnation: str = "i1") -> dict:
        return {"id": sid, "worker": worker, "incarnation": incarnation, "node_id": "n0"}

    registry = SessionRegistry()  # as Ray restarts it: empty
    ended = [{**rec("old"), "closed_reason": "deleted by the API", "frames_sent": 10}]
    registry.sync("w0", "i1", [rec("a"), rec("b")], ended)
    states = {r["id"]: (r["state"], r.get("reason")) for r in registry.list()}
    assert states == {
        "a": ("live", None),
        "b": ("live", None),
        "old": ("closed", "deleted by the API"),
    }

    # b ended while its report was lost; the worker's next sync says so, with its reason
    ended.append({**rec("b"), "closed_reason": "connection failed"})
    registry.sync("w0", "i1", [rec("a")], ended)
    assert registry.lookup("b")["state"] == "closed"
    assert registry.lookup("b")["reason"] == "connection failed"
    # only one incarnation's sessions end; history comes back once, not on every sync
    registry.opened(rec("c", "w1", "i9"))
    registry.sync("w0", "i1", [rec("a")], [])
    assert registry.lookup("c")["state"] == "live"
    assert [r["id"] for r in registry.list()] == ["a", "c", "old", "b"]
    # a session the front ended with its lost worker is not brought back by that worker
    registry.worker_lost("w1", "i9", "worker w1 died")
    registry.sync("w1", "i9", [rec("c", "w1", "i9")], [])
    assert registry.lookup("c")["reason"] == "worker w1 died"


def test_a_session_closed_through_the_front_frees_its_slot_at_once():
    """The front counts a worker's sessions from its last status; one it closed itself is
    off that count when the close answers, so the next offer is placed, not refused."""
    status = {"max_sessions": 2, "sessions": ["s1", "s2"], "reserved": 0, "draining": False}
    view = WorkerView("w", FakeActor(), state="ok", status=status, refused=True)
    assert view.free() == 0
    WorkerPool.session_ended(view, "s1")
    assert view.free() == 1 and view.status["sessions"] == ["s2"]
    WorkerPool.session_ended(view, "s-unknown")  # closed twice, or never here: no change
    assert view.free() == 1
