"""`pipeline.graphs.ShapeGraphs` on a GPU, before any run relies on it (the CPU's tests
cannot capture CUDA graphs): a small network replays eager's exact numbers for new inputs of
two shapes, a function that reads back to the host stays eager with one log line, and the
thread's stream and random draws work after that failed capture; then the real speech
encoder's graph, where a wav2vec2 folder is given, against its eager features (captured, and
within `REPLAY_TOLERANCE`).

    python bench/graphs_check.py [--wav2vec DIR] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.graphs import REPLAY_TOLERANCE, ShapeGraphs  # noqa: E402


def check_small_network() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    net = net.cuda().eval().requires_grad_(False)
    graphed = ShapeGraphs(lambda x: net(x), "check")
    with torch.inference_mode():
        for batch in (1, 3, 1):
            for _ in range(3):
                x = torch.randn(batch, 17, 64, device="cuda")
                assert torch.equal(graphed(x), net(x)), "a replay differs from eager"
    assert graphed.captured == 2, graphed.captured
    print("small network: 2 shapes captured, every replay equal to eager")


def check_host_read_stays_eager() -> None:
    graphed = ShapeGraphs(lambda x: x * float(x.sum()), "check")
    x = torch.ones(4, device="cuda")
    for _ in range(2):
        assert torch.equal(graphed(x), x * 4.0)
    assert graphed.captured == 0
    assert torch.cuda.current_stream() == torch.cuda.default_stream(), "left on another stream"
    y = torch.randn(1024, device="cuda")  # random draws still work after the failed capture
    assert torch.isfinite((y @ y).cpu())
    print("a host read: stays eager, CUDA usable after")


def check_speech(folder: str, dtype: torch.dtype) -> None:
    from pipeline.models.encoders.s2v_speech import S2VSpeechFeatures

    plain = S2VSpeechFeatures(folder, "cuda", dtype)
    graphed = S2VSpeechFeatures(folder, "cuda", dtype, graphs=True)
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(3):
        audio = (0.1 * rng.standard_normal(64000)).astype(np.float32)
        got, want = graphed.hidden_states(audio).float(), plain.hidden_states(audio).float()
        worst = max(worst, float((got - want).norm() / want.norm()))
    captured = graphed.graphs_captured()
    print(f"wav2vec2 ({folder}, {dtype}): {captured} graph(s), rel. L2 from eager {worst:.2g}")
    assert captured > 0, "the speech encoder stayed eager"
    assert worst <= REPLAY_TOLERANCE, worst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wav2vec")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    check_small_network()
    check_host_read_stays_eager()
    if a.wav2vec:
        check_speech(a.wav2vec, getattr(torch, a.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
