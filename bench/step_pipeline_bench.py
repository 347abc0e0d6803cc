"""LiveAvatar's step pipeline (`pipeline.parallel.step_pipeline`) over several GPUs: how fast
blocks come out of the line, against one GPU running every step.

    python bench/step_pipeline_bench.py --step-ranks 2 [--decode-rank] [--size 704x384]
        [--layers 40] [--blocks 12] [--json OUT] [--device cuda|cpu]

One process a rank (`pipeline.parallel.launch`: NCCL on GPUs, gloo on CPU processes). Each
step rank holds the whole transformer at the release's shape with random bf16 weights drawn
on its GPU (`liveavatar_block_bench.random_on_device`), eager, and a cache of its steps; rank 0
draws the noise and encodes each block's audio tokens from random wav2vec2 features. The
collector (the decode rank, else rank 0) records when each block's final latents arrive; no
VAE runs (a decode rank would add its own ~0.1 s a block beside the line, not in it).

Reported: the line's period (the median interval between blocks once it is full), each
block's latency (from rank 0 drawing its noise to its arrival, on one host clock), the first
block's, and the real-time factor of 12 frames (0.48 s) a period. The single-GPU number to
hold it against is `liveavatar_block_bench.py`'s block at the same settings (eager bf16:
~1.28 s a block on the H200). `--device cpu` (small `--size`, `--layers`) only checks that it
runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from liveavatar_block_bench import layers_config, random_on_device  # noqa: E402

from pipeline.clock import FPS  # noqa: E402
from pipeline.models.wan.s2v import S2VConfig, S2VTransformer  # noqa: E402
from pipeline.parallel.launch import ParallelOptions, launch  # noqa: E402
from pipeline.parallel.step_pipeline import (  # noqa: E402
    StepLayout,
    StreamStart,
    run_step_pipeline,
    share_start,
)


def _worker(rank: int, opts: ParallelOptions, layout: StepLayout, a, out: Path) -> None:
    dev = torch.device(f"cuda:{rank}" if a.device == "cuda" else "cpu")
    cfg = layers_config(a.layers)
    height, width = (int(v) for v in a.size.split("x"))
    H, W = height // 8, width // 8
    start = None
    if rank == 0:
        g = torch.Generator(device=dev).manual_seed(1)

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=dev, dtype=torch.bfloat16)

        start = StreamStart(
            prompt_BLC=randn(1, 40, cfg.text_dim),
            ref_BC1HW=randn(1, cfg.in_dim, 1, H, W),
            motion_BCTHW=randn(1, cfg.in_dim, cfg.motion_latent_frames, H, W),
            seed=2,
            dtype=torch.bfloat16,
        )
    shared = share_start(start, src=0, device=dev)
    drawn: dict[int, float] = {}  # rank 0: when each block's noise was drawn (host clock)
    arrived: dict[int, float] = {}  # the collector: when each block's final latents came

    def model() -> S2VTransformer:
        with torch.device("meta"):
            m = S2VTransformer(cfg).to(torch.bfloat16)
        m.to_empty(device=dev)
        random_on_device(m, 0)
        return m.eval().requires_grad_(False)

    def blocks():
        feats = torch.randn(
            1, cfg.audio_layers, cfg.audio_dim, 4 * cfg.frames_per_block, device=dev
        ).to(torch.bfloat16)
        for b in range(a.blocks):
            drawn[b] = time.time()
            yield feats

    def on_latents(block: int, x: torch.Tensor) -> None:
        arrived[block] = time.time()

    run_step_pipeline(rank, layout, cfg, model, shared, blocks() if rank == 0 else (), on_latents)
    if rank == 0:
        (out / "drawn.json").write_text(json.dumps(drawn))
    if rank == layout.collector:
        (out / "arrived.json").write_text(json.dumps(arrived))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-ranks", type=int, default=2)
    p.add_argument("--decode-rank", action="store_true", help="a rank of its own collects")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--size", default="704x384", help="video height x width in pixels")
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json")
    a = p.parse_args()
    layout = StepLayout(a.steps, decode_rank=a.decode_rank, step_ranks=a.step_ranks)
    if a.device == "cuda" and torch.cuda.device_count() < layout.world:
        raise SystemExit(f"{layout} needs {layout.world} GPUs, {torch.cuda.device_count()} here")
    with tempfile.TemporaryDirectory() as tmp:  # the ranks' clocks, handed back as files
        out = Path(tmp)
        t = time.perf_counter()
        launch(_worker, ParallelOptions(world=layout.world), layout, a, out)
        launched = time.perf_counter() - t
        drawn = {int(k): v for k, v in json.loads((out / "drawn.json").read_text()).items()}
        arrived = {int(k): v for k, v in json.loads((out / "arrived.json").read_text()).items()}
    order = sorted(arrived)
    full = order[layout.ranks :]  # once the line is full
    period = statistics.median(arrived[b] - arrived[b - 1] for b in full) if full else None
    latency = statistics.median(arrived[b] - drawn[b] for b in order[1:])
    video = 4 * S2VConfig().frames_per_block / FPS
    report = {
        "layout": {"steps": a.steps, "step_ranks": layout.ranks, "decode_rank": a.decode_rank},
        "size": a.size,
        "layers": a.layers,
        "blocks": len(order),
        "period_s": period,
        "latency_s": latency,
        "first_block_s": arrived[order[0]] - drawn[order[0]],
        "realtime_factor": video / period if period else None,
        "launched_s": launched,
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "dtype": "bfloat16, eager",
    }
    print(
        f"{layout}: a block every {period or 0:.3f} s once full (x{report['realtime_factor'] or 0:.2f}"
        f" real time), latency {latency:.3f} s, first block {report['first_block_s']:.3f} s"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
