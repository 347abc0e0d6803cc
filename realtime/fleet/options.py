"""How a fleet is laid out and timed: `FleetOptions`, its flags, and the Ray resources a
worker asks for.

A worker on a GPU node asks Ray for one GPU (`num_gpus=1`), so a node with N GPUs hosts N
workers and Ray puts each on its own device (`CUDA_VISIBLE_DEVICES`). A worker on a CPU
node asks for one unit of the custom resource `facecast_cpu_worker`, which a node declares
with `ray start --resources '{"facecast_cpu_worker": 2}'`: a CPU node has no natural unit
of "room for one engine", so the operator says how many fit.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

CPU_WORKER = "facecast_cpu_worker"  # custom Ray resource: room for one engine on a CPU node
NAMESPACE = "facecast"  # Ray namespace of the workers and the registry
WORKER_PREFIX = "facecast-worker-"


@dataclass(frozen=True)
class FleetOptions:
    address: str | None = None  # Ray address (host:port, ray://…, "auto"); None: start one
    workers: int = 1  # worker actors to keep; those that do not fit wait for a node
    sessions_per_worker: int = 1
    worker_restarts: int = 0  # Ray's max_restarts of a worker (-1: always)
    namespace: str = NAMESPACE
    call_timeout_s: float = 5.0  # status, interrupt, delete, metrics calls to a worker
    offer_timeout_s: float = 30.0  # negotiating an offer on a worker (ICE gathering)
    probe_interval_s: float = 0.5  # how often the front asks each worker how it is
    lost_after_s: float = 4.0  # a worker silent this long is lost (its sessions end)
    connect_timeout_s: float = 30.0  # reaching the Ray cluster at start

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers {self.workers}: a fleet needs at least 1 worker")
        if self.sessions_per_worker < 1:
            raise ValueError(f"--sessions-per-worker {self.sessions_per_worker}: must be >= 1")
        if self.worker_restarts < -1:
            raise ValueError(f"--worker-restarts {self.worker_restarts}: use -1 (always) or >= 0")
        for name in ("call_timeout_s", "offer_timeout_s", "probe_interval_s", "lost_after_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)}: must be > 0 seconds")
        if self.lost_after_s <= self.probe_interval_s:
            raise ValueError("lost_after_s must be longer than probe_interval_s")

    def worker_name(self, index: int) -> str:
        return f"{WORKER_PREFIX}{index}"


def worker_resources(device: str) -> dict:
    """Ray actor options that place one worker: a GPU each, or a CPU worker slot."""
    if device.startswith("cuda"):
        return {"num_cpus": 0, "num_gpus": 1}
    return {"num_cpus": 0, "resources": {CPU_WORKER: 1}}


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fleet (sessions across the nodes of a Ray cluster)")
    group.add_argument(
        "--cluster",
        choices=["none", "ray"],
        default="none",
        help="ray: this process is a front; sessions run on worker actors of a Ray cluster",
    )
    group.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="the cluster's address (host:6379, or auto); default: start Ray on this machine",
    )
    group.add_argument(
        "--workers", type=int, default=1, help="worker actors, one engine each (default 1)"
    )
    group.add_argument(
        "--sessions-per-worker", type=int, default=1, metavar="K", help="session slots a worker has"
    )
    group.add_argument(
        "--worker-restarts",
        type=int,
        default=0,
        metavar="R",
        help="let Ray restart a dead worker R times (-1: always), on another node if its "
        "node is gone; its sessions end either way",
    )


def fleet_from_args(args: argparse.Namespace) -> FleetOptions:
    """FleetOptions from parsed flags; ValueError names a bad value."""
    plan = getattr(args, "plan_sessions", None)  # the workers' servers plan for it
    if plan is not None and plan > args.sessions_per_worker:
        raise ValueError(
            f"--plan-sessions {plan}: more than the {args.sessions_per_worker} "
            "--sessions-per-worker a worker admits"
        )
    return FleetOptions(
        address=args.ray_address,
        workers=args.workers,
        sessions_per_worker=args.sessions_per_worker,
        worker_restarts=args.worker_restarts,
    )
