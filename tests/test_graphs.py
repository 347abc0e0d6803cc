"""`pipeline.graphs.ShapeGraphs`: a function replayed from CUDA graphs, one per input shape,
with eager's numbers (up to reassociation) or eager itself. The graph tests need a GPU (they
run on the device machine: `python -m pytest tests/test_graphs.py`); on a CPU it is the
function."""

from __future__ import annotations

import pytest
import torch

from pipeline.graphs import ShapeGraphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def small_network(width: int = 64):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    )
    return net.eval().requires_grad_(False)


def test_on_a_cpu_it_is_the_function_itself():
    calls = []

    def fn(x, scale):
        calls.append((tuple(x.shape), scale))
        return x * scale

    graphed = ShapeGraphs(fn, "test")
    x = torch.arange(6.0).view(2, 3)
    torch.testing.assert_close(graphed(x, 2.0), x * 2.0)
    torch.testing.assert_close(graphed(x, 2.0), x * 2.0)
    assert calls == [((2, 3), 2.0)] * 2 and graphed.captured == 0


@cuda
def test_each_shape_replays_eagers_numbers_for_new_inputs():
    net = small_network().cuda()
    graphed = ShapeGraphs(lambda x: net(x), "test")
    with torch.inference_mode():
        for batch in (1, 3, 1):  # a shape met again replays its graph
            for seed in range(3):  # new values through the same graph
                x = torch.randn(
                    batch,
                    17,
                    64,
                    device="cuda",
                    generator=torch.Generator("cuda").manual_seed(seed),
                )
                assert torch.equal(graphed(x), net(x))
    assert graphed.captured == 2


@cuda
def test_a_function_that_waits_for_the_host_stays_eager(caplog):
    def reads_back(x):
        return x * float(x.sum())  # a host read: not capturable

    graphed = ShapeGraphs(reads_back, "test")
    x = torch.ones(4, device="cuda")
    with caplog.at_level("WARNING", logger="facecast.graphs"):
        torch.testing.assert_close(graphed(x), x * 4.0)
        torch.testing.assert_close(graphed(x), x * 4.0)
    assert graphed.captured == 0
    assert len([r for r in caplog.records if "runs eagerly" in r.getMessage()]) == 1
    # the thread is back on its own stream, and random draws work (the generator released)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert torch.isfinite(torch.randn(1024, device="cuda").sum().cpu())
