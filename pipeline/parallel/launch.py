"""One session on N devices: start N worker processes, one per GPU (or N CPU processes with
gloo), pin each next to its GPU's NUMA node, and shard the DiTs across them.

Every rank runs the same session on the same inputs; the DiTs are split (Ulysses over
tokens, FSDP2 over weights), everything else is replicated. Rank 0 owns the I/O: it reads
the reference and the audio, broadcasts them, and writes the output.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("facecast.parallel")

# NVLink SHARP / multicast stays off on the lent machines (see the device tool's README).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_NVLSTREE_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"}


@dataclass(frozen=True)
class ParallelOptions:
    world: int
    head_groups: int = 2  # Ulysses head groups (G); 1 = one all-to-all per attention
    fsdp: bool = True
    fsdp_offload: bool = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def numa_cpus_for_gpu(index: int) -> set[int] | None:
    """CPUs of the NUMA node the GPU hangs off, when the host reports one."""
    try:
        # pci_bus_id is not in torch's declared properties; builds without it raise
        # AttributeError, caught below
        props: Any = torch.cuda.get_device_properties(index)
        bus = str(props.pci_bus_id).lower()
        node = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text())
        if node < 0:
            return None
        cpulist = Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip()
    except (OSError, ValueError, AttributeError, RuntimeError):
        return None
    cpus: set[int] = set()
    for part in cpulist.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def launch(fn: Callable, opts: ParallelOptions, *args, start_method: str = "spawn") -> None:
    """Run fn(rank, opts, *args) in opts.world processes with torch.distributed set up.

    `start_method="fork"` (CPU only: CUDA does not survive a fork) starts the workers as
    copies of this process, without their seconds of imports each: for tests on the CPU."""
    if start_method == "fork" and torch.cuda.is_initialized():
        raise RuntimeError("launch(start_method='fork') after CUDA was initialised: use spawn")
    os.environ.update(NCCL_ENV)
    port = free_port()
    # a forked worker runs one CPU thread: the parent's OpenMP pool does not survive a fork
    threads = 1 if start_method == "fork" else max(1, (os.cpu_count() or 1) // opts.world)
    torch.multiprocessing.start_processes(
        _worker,
        args=(fn, opts, port, args, threads),
        nprocs=opts.world,
        start_method=start_method,
    )


def _worker(
    rank: int, fn: Callable, opts: ParallelOptions, port: int, args: tuple, threads: int
) -> None:
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(rank)
        cpus = numa_cpus_for_gpu(rank)
        if cpus:
            os.sched_setaffinity(0, cpus)
    else:
        torch.set_num_threads(threads)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=opts.world,
    )
    try:
        fn(rank, opts, *args)
        # no rank tears its transport down while another still talks to it (gloo aborts)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Success: leave without interpreter finalisation. Gloo and TCPStore threads that are
    # still being torn down while Python finalises can abort the process ("terminate called
    # without an active exception", seen twice in CI after a clean barrier and destroy), and
    # the rank has nothing left to do: its outputs are written and closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def parallelize_engine(engine, opts: ParallelOptions) -> None:
    """Split both DiTs of a loaded engine over the default process group."""
    from torch.distributed.device_mesh import init_device_mesh

    from pipeline.parallel.fsdp import shard_weights
    from pipeline.parallel.ulysses import parallelize_sequence

    mesh = init_device_mesh(engine.device.type, (opts.world,)) if opts.fsdp else None
    world = dist.group.WORLD
    assert world is not None, "init_process_group runs before parallelize_engine"
    for name in ("a2v", "sr"):
        model = engine.modules[name].model
        parallelize_sequence(model, world, opts.head_groups)
        if mesh is not None:
            shard_weights(model, mesh, offload=opts.fsdp_offload)


def render_worker(
    rank: int,
    opts: ParallelOptions,
    cfg,
    device: str,
    reference: str,
    audio: str,
    out: str,
    seed: int,
) -> None:
    """Batch render on every rank; rank 0 reads the inputs and writes the MP4."""
    from pipeline.diffusion.engine import Engine
    from pipeline.media import Mp4Writer, iter_audio, load_image

    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    engine = Engine.load(cfg, dev)
    parallelize_engine(engine, opts)
    image_box = [load_image(reference) if rank == 0 else None]
    dist.broadcast_object_list(image_box, src=0)
    image = image_box[0]
    assert image is not None, "rank 0 broadcast the reference"
    session = engine.new_stream(image, seed=seed)
    writer = Mp4Writer(out, cfg.video.width, cfg.video.height) if rank == 0 else None
    blocks = iter_audio(audio) if rank == 0 else None
    try:
        while True:
            block_box = [next(blocks, None) if blocks is not None else None]
            dist.broadcast_object_list(block_box, src=0)
            block = block_box[0]
            if block is None:
                break
            session.push_audio(block.model)
            batches = session.generate_ready()
            if writer is not None:
                writer.write_audio(block.output)
                for b in batches:
                    writer.write_frames(b.frames)
        for b in session.finish():
            if writer is not None:
                writer.write_frames(b.frames)
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        session.close()
