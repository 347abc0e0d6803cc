"""CUDA graphs for the small fixed-shape models of a step, whose kernels are shorter than
their launches.

The speech encoders (wav2vec2-base for FlashHead, wav2vec2-large for LiveAvatar) read the
same window of audio every step: a few hundred kernels of microseconds each, so their time
is the host's, launching them, while the GPU waits (bench/RESULTS.md: 22 ms of FlashHead's
step run eagerly, waited for kernel by kernel). A CUDA graph launches them all at once.

`ShapeGraphs(fn)` calls `fn(x, *args)` through a graph captured for each input shape (and
static arguments) it meets: the input copied into the graph's own buffer, the graph
replayed, its output copied out. A shape is captured the first time it comes (start-up's
warm-up runs every shape a stream will use) and checked there: the replay must equal `fn`'s
eager output exactly, or that shape stays eager, said once in the log. On a CPU it is `fn`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

log = logging.getLogger("facecast.graphs")

MAX_SHAPES = 8  # graphs kept per function: a stream's shapes (batch sizes) are few


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    input: Tensor
    output: Tensor


class ShapeGraphs:
    """`fn(x, *args)` replayed from a CUDA graph for each (shape of x, args); see the module."""

    def __init__(self, fn: Callable[..., Tensor], name: str) -> None:
        self.fn = fn
        self.name = name
        self._graphs: dict[tuple, _Graph | None] = {}  # None: this shape runs eagerly

    def __call__(self, x: Tensor, *args: object) -> Tensor:
        if x.device.type != "cuda":
            return self.fn(x, *args)
        key = (tuple(x.shape), x.dtype, *args)
        if key not in self._graphs:
            self._graphs[key] = self._capture(x, args) if len(self._graphs) < MAX_SHAPES else None
        graph = self._graphs[key]
        if graph is None:
            return self.fn(x, *args)
        graph.input.copy_(x)
        graph.graph.replay()
        return graph.output.clone()  # the caller's own: the next replay rewrites the buffer

    @property
    def captured(self) -> int:
        """Shapes that run from a graph."""
        return sum(g is not None for g in self._graphs.values())

    def _capture(self, x: Tensor, args: tuple) -> _Graph | None:
        static_in = x.clone()
        side = torch.cuda.Stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):  # warm-up off the capture: lazy inits, workspaces
            for _ in range(2):
                eager = self.fn(static_in, *args)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                static_out = self.fn(static_in, *args)
        except RuntimeError as exc:  # something in fn waits for the host: eager it stays
            log.warning("%s: no CUDA graph for %s (%s); it runs eagerly", self.name, x.shape, exc)
            return None
        graph.replay()
        if not torch.equal(static_out, eager):
            log.warning(
                "%s: its CUDA graph for %s differs from the eager result; it runs eagerly",
                self.name,
                tuple(x.shape),
            )
            return None
        return _Graph(graph, static_in, static_out)
