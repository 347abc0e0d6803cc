"""CUDA graphs for the small fixed-shape models of a step, whose kernels are shorter than
their launches.

The speech encoders (wav2vec2-base for FlashHead, wav2vec2-large for LiveAvatar) read the
same window of audio every step: a few hundred kernels of microseconds each, so their time
is the host's, launching them, while the GPU waits (bench/RESULTS.md: 22 ms of FlashHead's
step run eagerly, waited for kernel by kernel). A CUDA graph launches them all at once.

`ShapeGraphs(fn)` calls `fn(x, *args)` through a graph captured for each input shape (and
static arguments) it meets: the input copied into the graph's own buffer, the graph
replayed, its output copied out. A shape is captured the first time it comes (start-up's
warm-up runs every shape a stream will use) and checked there: replayed on that input and on
another, the graph must give `fn`'s eager output up to reassociation (`REPLAY_TOLERANCE`), or
that shape stays eager, said once in the log, as it does when the capture fails (something in
`fn` waits for the host). On a CPU it is `fn`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

log = logging.getLogger("facecast.graphs")

MAX_SHAPES = 8  # graphs kept per function: a stream's shapes (batch sizes) are few
# A replay may differ from eager by reassociation: under capture cuBLAS may pick other GEMM
# algorithms. On the H200, wav2vec2-large's graph in bf16 (24 layers) was 0.0089 from eager on
# one input and just over 0.01 on another (2026-12-04), which is bf16's rounding carried
# through the layers; a graph that computes something else (a value fixed at capture) is ~1
# away, so the line sits well above the first and well below the second.
REPLAY_TOLERANCE = 5e-2


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
        device = x.device
        static_in = x.clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture: lazy inits, workspaces
            for _ in range(2):
                self.fn(static_in, *args)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        failed: Exception | None = None
        # Not `torch.cuda.graph`: when its capture fails it leaves the thread on its capture
        # stream. Here the stream context closes whatever happens, and "thread_local" lets
        # the server's other threads use CUDA meanwhile.
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                static_out = self.fn(static_in, *args)
            except RuntimeError as exc:  # something in fn waits for the host
                failed = exc
            try:
                graph.capture_end()
            except RuntimeError as exc:
                failed = failed or exc
        torch.cuda.current_stream(device).wait_stream(side)
        if failed is not None:
            _release_generator(device)
            log.warning(
                "%s: no CUDA graph for %s (%s); it runs eagerly", self.name, x.shape, failed
            )
            return None
        distance = self._replay_distance(graph, static_in, static_out, x, args)
        if distance > REPLAY_TOLERANCE:
            log.warning(
                "%s: its CUDA graph for %s is %.3g from the eager result; it runs eagerly",
                self.name,
                tuple(x.shape),
                distance,
            )
            return None
        return _Graph(graph, static_in, static_out)

    def _replay_distance(
        self, graph: torch.cuda.CUDAGraph, static_in: Tensor, static_out: Tensor, x: Tensor, args
    ) -> float:
        """The larger relative L2 distance of two replays from eager: on the captured input,
        and on another one (the input reversed), which a value fixed at capture would miss."""
        distance = 0.0
        for probe in (x, x.flip(-1)):
            static_in.copy_(probe)
            graph.replay()
            eager = self.fn(probe, *args)
            diff = (static_out.float() - eager.float()).norm()
            distance = max(distance, float(diff / eager.float().norm().clamp_min(1e-12)))
        return distance


def _release_generator(device: torch.device) -> None:
    """After a failed capture the device's random generator still counts itself as capturing
    (torch 2.11 ends that only in a capture that succeeds), and the next random draw outside
    a capture raises. Its state is swapped for a copy (same seed, same offset) that is not."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    generator.graphsafe_set_state(generator.clone_state())
