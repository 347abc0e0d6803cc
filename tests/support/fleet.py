"""The fleet tests' cluster and fronts: a multi-node Ray cluster on loopback
(`ray.cluster_utils.Cluster`), a front on a loopback port with its own workers, and the
small HTTP helpers their tests call it with.

Import only where Ray is installed (the `fleet` extra; the `test` extra pulls it in).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import ray
from ray.cluster_utils import Cluster

from facecast_client import FacecastClient, PcmSource
from pipeline.startup import EngineOptions
from realtime.fleet.options import CPU_WORKER, FleetOptions
from realtime.service import ServerConfig


@contextlib.contextmanager
def loopback_cluster(nodes: int = 2) -> Iterator[Cluster]:
    """A head without worker room and `nodes` nodes with room for one CPU worker each
    (`facecast_cpu_worker`); this process is its driver."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(nodes):
        c.add_node(num_cpus=1, resources={CPU_WORKER: 1})
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@contextlib.asynccontextmanager
async def running_front(
    namespace: str,
    workers: int,
    per_worker: int,
    device: str = "cpu",
    end: bool = True,
    engine_config: str = "tiny",
    **fleet: object,
) -> AsyncIterator[tuple[str, object]]:
    """A front on a loopback port with its own workers of engine config `engine_config` (`fleet`: more
    FleetOptions);
    yields (url, pool). With `end`, every actor of the namespace is ended afterwards, so
    the nodes' room is free for the next test."""
    from aiohttp import web

    from realtime.edge import FacecastRunner
    from realtime.fleet.front import build_front_app, make_pool

    config = ServerConfig(port=0)
    options = FleetOptions(
        workers=workers, sessions_per_worker=per_worker, namespace=namespace, **fleet
    )
    pool = make_pool(config, EngineOptions(config=engine_config, device=device), options)
    app = build_front_app(config, pool)
    runner = FacecastRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        await pool.start()
        yield url, pool
    finally:
        await pool.stop()
        await runner.cleanup()
        if end:
            await asyncio.to_thread(end_namespace, namespace)


def end_namespace(namespace: str, timeout: float = 15.0) -> None:
    """Kill every actor of `namespace` and wait until Ray lists none, so the next test
    finds the nodes' room free."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [
            e["name"]
            for e in ray.util.list_named_actors(all_namespaces=True)
            if e["namespace"] == namespace
        ]
        if not names:
            return
        for name in names:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        time.sleep(0.2)
    raise AssertionError(f"actors of {namespace} still listed after {timeout} s")


async def ready(pool, workers: int, timeout: float = 150.0) -> None:
    ok = await pool.wait_for(lambda p: p.capacity()["workers"] >= workers, timeout)
    assert ok, [v.describe() for v in pool.workers.values()]


async def get_json(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as r:
            return r.status, await r.json()


async def post_json(url: str, body: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body or {}) as r:
            return r.status, await r.json()


async def connect(url: str, source: PcmSource | None = None, **kwargs) -> FacecastClient:
    client = FacecastClient(url, source or PcmSource(), **kwargs)
    await client.connect()
    return client


def session_of(sessions: list[dict], session_id: str) -> dict:
    return next(s for s in sessions if s["id"] == session_id)
