"""The fleet on a real multi-node Ray cluster on loopback (`ray.cluster_utils.Cluster`).

One cluster is shared by the module (Ray's start-up is costly on 2 cores): a head without
worker room and two nodes with room for one CPU worker each (`facecast_cpu_worker`;
`support.fleet.loopback_cluster`). Each
test runs its own front, in its own Ray namespace, with real worker actors serving the
`tiny` engine to real aiortc clients; whatever a test adds to the cluster it removes.
The tests on the cluster are `slow`; those without one stay in `make test-fast`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from support.realtime import REAL_TIME_ON_A_SHARED_CPU, make_speech_wav, normalized_xcorr_peak

from facecast_client import FacecastClient, PcmSource, wait_until_ready
from facecast_client.call import call_stats
from pipeline.startup import EngineOptions
from realtime.fleet.options import CPU_WORKER, NAMESPACE, FleetOptions, worker_resources
from realtime.service import ServerConfig

ray = pytest.importorskip("ray")  # the `test` extra pulls in `fleet`: present in CI

from support.fleet import (  # noqa: E402
    connect,
    end_namespace,
    get_json,
    loopback_cluster,
    post_json,
    ready,
    running_front,
    session_of,
)

from realtime.fleet.actor import worker_actor  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    return (
        make_speech_wav(d / "a.wav", [0.3, "Good morning, this is the first caller.", 0.5]),
        make_speech_wav(d / "b.wav", [0.3, "Seven green bottles on the wall.", 0.5], "en-us"),
    )


async def refused(url: str) -> str:
    """A valid offer that must get 503; returns the reason."""
    client = FacecastClient(url, PcmSource())
    with pytest.raises(ConnectionError, match=r"\(503\)") as info:
        await client.connect()
    await client.close(release=False)
    return str(info.value)


def cadence(client: FacecastClient, start: float, end: float) -> tuple[float, float]:
    """fps and the longest gap (s) of the video frames that arrived in [start, end]."""
    t = np.array(client.received.video_arrival)
    t = t[(t >= start) & (t <= end)]
    assert t.size > 2, (t.size, start, end)
    return (t.size - 1) / (t[-1] - t[0]), float(np.diff(t).max())


def moving(client: FacecastClient) -> bool:
    frames = client.received.frames
    distinct = {f.tobytes() for f in frames}
    spread = np.abs(frames[-1].astype(np.int16) - frames[0].astype(np.int16)).mean()
    return len(distinct) >= 0.1 * len(frames) and spread > 1.0


@pytest.mark.slow
@pytest.mark.timeout(240)
@REAL_TIME_ON_A_SHARED_CPU
async def test_two_nodes_one_slot_each(cluster, voices):
    a_wav, b_wav = voices
    async with running_front("fleet-two", workers=2, per_worker=1) as (url, pool):
        await ready(pool, 2)
        a = await connect(url, PcmSource(a_wav.pcm), keep_frames=True)
        b = await connect(url, PcmSource(b_wav.pcm), keep_frames=True)
        reason = await refused(url)
        assert "every worker is full" in reason
        _, listed = await get_json(f"{url}/sessions")
        sa, sb = (
            session_of(listed["sessions"], a.session_id),
            session_of(listed["sessions"], b.session_id),
        )
        assert sa["worker"] != sb["worker"] and sa["node_id"] != sb["node_id"], listed
        await a.wait_frames(1, timeout=30)
        await b.wait_frames(1, timeout=30)
        start = time.monotonic()
        await asyncio.sleep(max(a_wav.duration, b_wav.duration) + 1.0)
        end = time.monotonic()
        async with aiohttp.ClientSession() as http:
            metrics = await (await http.get(f"{url}/metrics")).text()
        for worker in (sa["worker"], sb["worker"]):
            assert f'facecast_video_frames_sent_total{{worker="{worker}"}}' in metrics
        assert 'facecast_fleet_session_slots{kind="free"} 0.0' in metrics

        await a.close(release=False)  # the caller just hangs up
        left = time.monotonic()
        c = None
        while c is None:
            try:
                c = await connect(url)
            except ConnectionError:
                assert time.monotonic() - left < 5.0, "no slot came back within 5 s"
                await asyncio.sleep(0.2)
        accepted = time.monotonic() - left
        _, listed = await get_json(f"{url}/sessions")
        assert session_of(listed["sessions"], c.session_id)["worker"] == sa["worker"]
        assert session_of(listed["sessions"], a.session_id)["state"] == "closed"
        await b.close()
        await c.close()

    for client in (a, b):
        fps, gap = cadence(client, start, end)
        assert fps >= 24.0, (fps, gap, call_stats(client))
        assert moving(client)
    got_a, got_b = a.received.audio_timeline(), b.received.audio_timeline()
    own = normalized_xcorr_peak(got_a, a_wav.pcm), normalized_xcorr_peak(got_b, b_wav.pcm)
    cross = normalized_xcorr_peak(got_a, b_wav.pcm), normalized_xcorr_peak(got_b, a_wav.pcm)
    assert min(own) > 0.6 and max(cross) < 0.25, (own, cross)
    assert accepted < 5.0


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_killed_worker_ends_only_its_sessions(cluster, voices):
    async with running_front("fleet-kill", workers=2, per_worker=2) as (url, pool):
        await ready(pool, 2)
        a = await connect(url, PcmSource(voices[0].pcm, loop=True))
        b = await connect(url)
        _, listed = await get_json(f"{url}/sessions")
        sa, sb = (
            session_of(listed["sessions"], a.session_id),
            session_of(listed["sessions"], b.session_id),
        )
        assert sa["worker"] != sb["worker"]  # the most free slots: one each
        await a.wait_frames(50, timeout=30)
        victim = pool.workers[sb["worker"]]
        killed = time.monotonic()
        os.kill(victim.status["pid"], signal.SIGKILL)

        async def closed() -> dict:
            while True:
                _, body = await get_json(f"{url}/sessions")
                record = session_of(body["sessions"], b.session_id)
                if record["state"] == "closed":
                    return record
                await asyncio.sleep(0.2)

        record = await asyncio.wait_for(closed(), 10.0)
        reported = time.monotonic() - killed
        assert sb["worker"] in record["reason"], record
        _, workers = await get_json(f"{url}/workers")
        assert workers["slots"] == 2 and workers["workers"] == 1, workers  # the survivor's
        # the other call across the kill and its detection, before a new call shares
        # its worker's engine
        await asyncio.sleep(max(0.0, killed + 4.0 - time.monotonic()))
        fps, gap = cadence(a, killed - 1.0, time.monotonic())
        c = await connect(url)
        _, listed = await get_json(f"{url}/sessions")
        assert session_of(listed["sessions"], c.session_id)["worker"] == sa["worker"]
        assert session_of(listed["sessions"], a.session_id)["state"] == "live"
        await c.close()
        await a.close()
        await b.close(release=False)
    assert reported < 10.0
    assert fps >= 24.0 and gap < 0.5, (fps, gap)  # the other call never froze


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_drained_worker_finishes_its_session_then_leaves(cluster):
    async with running_front("fleet-drain", workers=2, per_worker=2) as (url, pool):
        await ready(pool, 2)
        time.sleep(5.0)  # noqa: ASYNC251 - on purpose: the front's loop stalls past lost_after_s
        await asyncio.sleep(1.0)
        assert [v.state for v in pool.workers.values()] == ["ok", "ok"], "a stalled front kept them"
        a = await connect(url)
        _, listed = await get_json(f"{url}/sessions")
        drained = session_of(listed["sessions"], a.session_id)["worker"]
        status, body = await post_json(f"{url}/workers/{drained}/drain")
        assert status == 200 and body["state"] == "draining", body
        b = await connect(url)  # its slot is free, but it takes no new session
        _, listed = await get_json(f"{url}/sessions")
        assert session_of(listed["sessions"], b.session_id)["worker"] != drained
        await a.wait_frames(1, timeout=30)
        frames = len(a.received.video_pts)
        await asyncio.sleep(2.0)
        assert len(a.received.video_pts) - frames >= 40, "the drained worker's call goes on"
        await a.close()  # the call ends the normal way
        gone = await pool.wait_for(lambda p: p.workers[drained].state == "drained", 10.0)
        _, workers = await get_json(f"{url}/workers")
        _, listed = await get_json(f"{url}/sessions")
        await b.close()
    assert gone, workers
    assert workers["workers"] == 1 and workers["slots"] == 2, workers
    record = session_of(listed["sessions"], a.session_id)
    assert record["state"] == "closed" and record["reason"] == "deleted by the API", record


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_node_added_takes_the_next_session_and_its_loss_ends_it(cluster):
    async with running_front("fleet-grow", workers=3, per_worker=1) as (url, pool):
        await ready(pool, 2)
        assert pool.workers["facecast-worker-2"].state == "pending"  # no room on any node
        first = [await connect(url), await connect(url)]
        await refused(url)
        # blocks the loop the front shares for seconds (Ray needs the main thread here): the
        # front must not take its own stall for silent workers
        node = cluster.add_node(num_cpus=1, resources={CPU_WORKER: 1})
        removed = False
        try:
            await ready(pool, 3)
            c = await connect(url)
            _, listed = await get_json(f"{url}/sessions")
            record = session_of(listed["sessions"], c.session_id)
            assert record["worker"] == "facecast-worker-2" and record["node_id"] == node.node_id
            lost = time.monotonic()
            await asyncio.to_thread(cluster.remove_node, node)  # lost, its session on it
            removed = True
            ended = await pool.wait_for(lambda p: p.capacity()["slots"] == 2, 10.0)
            _, listed = await get_json(f"{url}/sessions")
            after = time.monotonic() - lost
            for client in [*first, c]:
                await client.close()
        finally:
            await asyncio.to_thread(end_namespace, "fleet-grow")
            if not removed:
                await asyncio.to_thread(cluster.remove_node, node)
    assert ended and after < 10.0, after
    record = session_of(listed["sessions"], c.session_id)
    assert record["state"] == "closed" and "facecast-worker-2" in record["reason"], record
    others = [session_of(listed["sessions"], f.session_id)["state"] for f in first]
    assert others == ["live", "live"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_second_front_sees_and_interrupts(cluster, voices):
    """A second `facecast serve --cluster ray` process joins the cluster, lists a session
    the first front made, and interrupts it; the call outlives that front."""
    async with running_front(NAMESPACE, workers=2, per_worker=1) as (url, pool):
        await ready(pool, 2)
        a = await connect(url, PcmSource(voices[0].pcm, loop=True))
        port = free_port()
        second = subprocess.Popen(  # noqa: ASYNC220 - Popen returns at once; the child runs beside the loop
            [sys.executable, "-m", "facecast", "serve", "--cluster", "ray", "--ray-address",
             cluster.address, "--workers", "2", "--config", "tiny", "--device", "cpu",
             "--port", str(port)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            url2 = f"http://127.0.0.1:{port}"
            await wait_until_ready(url2, timeout=120, process=second)
            _, listed = await get_json(f"{url2}/sessions")
            record = session_of(listed["sessions"], a.session_id)
            assert record["state"] == "live" and record["node_id"], record
            await a.wait_event("speech_started", timeout=30)
            asked = time.monotonic()
            status, body = await post_json(f"{url2}/sessions/{a.session_id}/interrupt")
            assert status == 200 and body["played_ms"] >= 0, body
            event = await a.wait_event("interrupted", timeout=5, after=asked - 0.01)
            assert event["played_ms"] == body["played_ms"]
        finally:
            second.send_signal(signal.SIGTERM)
            out = second.communicate(timeout=30)[0]
        assert second.returncode == 0, out
        frames = len(a.received.video_pts)
        await asyncio.sleep(1.0)
        assert len(a.received.video_pts) - frames >= 20, "the call outlives the second front"
        await a.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_gpu_workers_one_per_gpu(cluster):
    """Ray's resource accounting places GPU workers (num_gpus=1 each) one per GPU; a GPU
    worker whose node has no usable CUDA fails its start-up with a reason in /healthz."""
    gpu_nodes = [cluster.add_node(num_cpus=1, num_gpus=n) for n in (1, 2)]
    try:
        placement = worker_resources("cuda")
        assert placement["num_gpus"] == 1
        options = (ServerConfig(), EngineOptions(config="tiny", device="cuda"))
        handles = [
            worker_actor(f"facecast-worker-{i}", "fleet-gpu", placement, 0).remote(
                f"facecast-worker-{i}", *options
            )
            for i in range(4)
        ]
        refs = [h.status.remote() for h in handles]
        placed, waiting = await asyncio.to_thread(ray.wait, refs, num_returns=3, timeout=60)
        assert len(placed) == 3, "three GPUs, three workers"
        late, _ = await asyncio.to_thread(ray.wait, waiting, timeout=2.0)
        assert not late, "the fourth waits: no GPU is free"
        where = [await asyncio.to_thread(ray.get, ref) for ref in placed]
        by_node: dict[str, set[str]] = {}
        for status in where:
            assert len(status["gpu_ids"]) == 1, status
            by_node.setdefault(status["node_id"], set()).update(status["gpu_ids"])
        assert by_node == {gpu_nodes[0].node_id: {"0"}, gpu_nodes[1].node_id: {"0", "1"}}
        ray.kill(handles[refs.index(placed[0])], no_restart=True)
        late = await asyncio.to_thread(ray.get, waiting[0], timeout=60)  # takes that GPU
        assert late["gpu_ids"] == where[0]["gpu_ids"] and late["node_id"] == where[0]["node_id"]
        await asyncio.to_thread(end_namespace, "fleet-gpu")

        async with running_front("fleet-gpu-fail", workers=1, per_worker=1, device="cuda") as (
            url,
            pool,
        ):
            await pool.wait_for(lambda p: p.workers["facecast-worker-0"].state == "failed", 60)
            status, health = await get_json(f"{url}/healthz")
        assert status == 503 and health["status"] == "failed", health
        assert "no CUDA GPU" in health["errors"][0], health

        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "facecast", "serve", "--cluster", "ray", "--ray-address",
             cluster.address, "--device", "cuda", "--config", "tiny", "--port",
             str(free_port())],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        assert done.returncode == 2, done
        assert any("no worker started" in e and "no CUDA GPU" in e for e in errors), done.stderr
    finally:
        for namespace in ("fleet-gpu", NAMESPACE):
            await asyncio.to_thread(end_namespace, namespace)
        for node in gpu_nodes:
            cluster.remove_node(node)


def test_bad_fleet_flags_exit_2_with_one_line(capsys):
    """Before any Ray call: bad counts, and an address nobody listens on (Ray's own
    connect would retry for a minute)."""
    from facecast.cli import main

    serve = ["serve", "--cluster", "ray", "--config", "tiny"]
    for args, expected in (
        (["--workers", "0"], "at least 1 worker"),
        (["--sessions-per-worker", "0"], "--sessions-per-worker 0"),
        (["--sessions-per-worker", "2", "--plan-sessions", "3"], "--plan-sessions 3"),
        (["--ray-address", f"127.0.0.1:{free_port()}"], "cannot reach the Ray cluster"),
        (["--ray-address", "no-port"], "use HOST:PORT"),
    ):
        status = main([*serve, *args])
        lines = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and expected in lines[0], (args, lines)


def test_workers_get_the_fronts_ice_servers_and_the_fleets_slots():
    from realtime.fleet.front import worker_config
    from realtime.ice_servers import parse_ice_server

    turn = parse_ice_server("turn:user:pass@turn.example.net:3478?transport=udp")
    front = ServerConfig(max_sessions=9, plan_sessions=2, token="s3cret", ice_servers=[turn])
    config = worker_config(front, FleetOptions(sessions_per_worker=3))
    assert config.max_sessions == 3 and config.peer_ice_servers == [turn]
    assert config.plan_sessions == 2  # each worker plans its calls as the front was told
    assert config.token is None  # the front checks it; workers take no HTTP


def test_worker_metrics_merge_into_one_family_labelled_by_worker():
    from prometheus_client.parser import text_string_to_metric_families

    from realtime.fleet.metrics import merge_labelled
    from realtime.metrics import RealtimeMetrics

    texts = []
    for name, sessions, share in (("w0", 2, 1.0), ("w1", 1, 0.5)):
        m = RealtimeMetrics()
        m.sessions_total.inc(sessions)
        m.fresh_share.set(share)
        texts.append((name, m.render().decode()))
    merged = merge_labelled(texts).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    totals = {
        s.labels["worker"]: s.value
        for s in families["facecast_sessions"].samples
        if s.name == "facecast_sessions_total"
    }
    assert totals == {"w0": 2.0, "w1": 1.0}
    share = {s.labels["worker"]: s.value for s in families["facecast_video_fresh_share"].samples}
    assert share == {"w0": 1.0, "w1": 0.5}
    assert merged.count("# TYPE facecast_video_fresh_share gauge") == 1


def test_a_lost_worker_ends_only_its_own_incarnations_sessions():
    from realtime.fleet.registry import SessionRegistry

    registry = SessionRegistry()
    for sid, worker, incarnation in (("a", "w0", "i1"), ("b", "w1", "i2"), ("c", "w0", "i0")):
        registry.opened({"id": sid, "worker": worker, "incarnation": incarnation})
    assert registry.worker_lost("w0", "i1", "worker w0 died") == ["a"]
    states = {r["id"]: (r["state"], r.get("reason")) for r in registry.list()}
    assert states == {"a": ("closed", "worker w0 died"), "b": ("live", None), "c": ("live", None)}
    registry.closed("a", "late report")  # the first reason stands
    assert registry.lookup("a")["reason"] == "worker w0 died"


def test_a_worker_reads_the_fronts_reference_from_bytes(tmp_path):
    """The front sends its --reference as bytes: no worker node needs the file."""
    from realtime.fleet.actor import FleetWorker

    photo = (REPO / "pipeline" / "assets" / "reference.png").read_bytes()
    worker = FleetWorker("w", ServerConfig(reference=None), EngineOptions(), reference=photo)
    assert worker.config.reference is not None
    assert Path(worker.config.reference).read_bytes() == photo
    assert worker.status()["state"] == "new"  # nothing starts before start()
