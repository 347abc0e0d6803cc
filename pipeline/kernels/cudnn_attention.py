"""Exact attention on cuDNN's fastest engine for the shape, through its graph API.

torch's SDPA runs LiveAvatar's self-attention on cuDNN's fused flash attention for Hopper
(1.65 ms a call, ~600 TFLOP/s on the H200; bench/RESULTS.md), taking the engine cuDNN's
heuristics rank first. cuDNN usually offers several engines (execution plans) for a shape, and
the first is not always the fastest. This backend builds the same bf16 attention as a cuDNN
graph (`nvidia-cudnn-frontend`, the 2 MB wheel the FP8 backend uses too), times every plan
cuDNN offers on the first inputs of each layout (three runs each, CUDA events, no host
syncs in between), and keeps the fastest, saying once which it chose. Same precision as
SDPA: bf16 in and out, fp32 softmax and accumulation.

The output keeps the queries' layout, so a (B, N, L, K) view of (B, L, N, K) queries gives
an output whose transpose back is free. Queries it cannot take (a CPU, a GPU before
Ampere, another dtype or head dim, the wheel missing, a shape cuDNN declines) go to torch's
exact SDPA, with one log line a reason (`pipeline.models.attention`).

Tuning costs each new layout (a key window that grows block by block is a few) about
plans x 3 calls once per process.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger("facecast.attention")

TIMED_RUNS = 3  # per candidate plan, the median kept


@functools.cache
def cudnn_installed() -> bool:
    return find_spec("cudnn") is not None


_handles: dict[int, Any] = {}  # device index → cuDNN handle


def cudnn_handle(device: torch.device) -> Any:
    """The process's cuDNN handle for `device`, made once (the graph API's, shared by every
    cuDNN backend here)."""
    import cudnn  # type: ignore[import-not-found]  # optional, GPU only

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _handles:
        with torch.cuda.device(index):
            _handles[index] = cudnn.create_handle()
    return _handles[index]


def cudnn_refusal(q: Tensor) -> str | None:
    """Why cuDNN's bf16 attention through the graph API cannot take these queries, or None."""
    if not q.is_cuda:
        return "it runs on an NVIDIA GPU only (cuDNN)"
    if torch.cuda.get_device_capability(q.device) < (8, 0):
        return "it needs an Ampere GPU or newer (compute capability 8.0)"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"it takes float16 or bfloat16, not {q.dtype}"
    if q.shape[-1] > 128 or q.shape[-1] % 8:
        return f"head dim {q.shape[-1]} is not a multiple of 8 up to 128"
    if not cudnn_installed():
        return "cudnn-frontend is not installed (pip install 'nvidia-cudnn-frontend==1.16.0')"
    return None


@dataclass
class _Tuned:
    """A built graph, the plan chosen for it, and what executing it needs."""

    graph: Any
    tensors: dict[str, Any]
    plan: int
    workspace: Tensor


_tuned: dict[tuple, _Tuned | str] = {}  # layouts → the tuned plan, or why cuDNN declined


def _layout(x: Tensor) -> tuple:
    return tuple(x.shape), tuple(x.stride())


def _graph(q: Tensor, k: Tensor, v: Tensor) -> tuple[Any, dict[str, Any]]:
    import cudnn

    io = cudnn.data_type.BFLOAT16 if q.dtype == torch.bfloat16 else cudnn.data_type.HALF
    fp32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=io,
        intermediate_data_type=fp32,
        compute_data_type=fp32,
        handle=cudnn_handle(q.device),
    )
    t = {
        name: graph.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=io)
        for name, x in (("q", q), ("k", k), ("v", v))
    }
    out, _ = graph.sdpa(
        q=t["q"],
        k=t["k"],
        v=t["v"],
        is_inference=True,
        attn_scale=1.0 / math.sqrt(q.shape[-1]),
        use_causal_mask=False,
        name="attention",
    )
    out.set_output(True).set_dim(list(q.shape)).set_stride(list(q.stride())).set_data_type(io)
    t["o"] = out
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    return graph, t


def _tune(q: Tensor, k: Tensor, v: Tensor) -> _Tuned:
    """Every plan cuDNN offers, built and timed on these inputs; the fastest kept."""
    import cudnn

    graph, t = _graph(q, k, v)
    handle = cudnn_handle(q.device)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
    out = torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device=q.device)
    pack = {t["q"]: q, t["k"]: k, t["v"]: v, t["o"]: out}
    timed: list[tuple[float, int, Tensor]] = []
    for i in range(graph.get_execution_plan_count()):
        try:
            graph.build_plan_at_index(i)
            size = graph.get_workspace_size_plan_at_index(i)
        except Exception:  # a candidate that does not build is no candidate
            continue
        workspace = torch.empty(size, dtype=torch.uint8, device=q.device)
        graph.execute_plan_at_index(pack, workspace, i, handle=handle)  # warm
        ms = []
        for _ in range(TIMED_RUNS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.execute_plan_at_index(pack, workspace, i, handle=handle)
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        timed.append((sorted(ms)[len(ms) // 2], i, workspace))
    if not timed:
        raise RuntimeError("no execution plan of cuDNN's builds for this shape")
    best_ms, best, workspace = min(timed, key=lambda x: x[0])
    first_ms = timed[0][0]
    log.info(
        "cuDNN attention for q %s, k %s: plan %d of %d (%s), %.3f ms (its first plan %.3f ms)",
        tuple(q.shape), tuple(k.shape), best, len(timed),
        graph.get_plan_name_at_index(best), best_ms, first_ms,
    )  # fmt: skip
    return _Tuned(graph, t, best, workspace)


def tuned_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor | str:
    """softmax(q kᵀ / √K) v for (B, N, L, K) queries, keys and values, on cuDNN's fastest
    plan for their layout, where `cudnn_refusal(q)` is None; a string (why cuDNN declined the
    shape) where it cannot, for the caller to fall back on the exact path."""
    import cudnn

    key = (q.device, q.dtype, _layout(q), _layout(k), _layout(v))
    if key not in _tuned:
        try:
            _tuned[key] = _tune(q, k, v)
        except Exception as err:  # cuDNN's "not supported" comes as several error types
            _tuned[key] = f"cuDNN declined q {tuple(q.shape)}, k {tuple(k.shape)}: {err}"[:300]
    tuned = _tuned[key]
    if isinstance(tuned, str):
        return tuned
    handle = cudnn_handle(q.device)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
    out = torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device=q.device)
    t = tuned.tensors
    tuned.graph.execute_plan_at_index(
        {t["q"]: q, t["k"]: k, t["v"]: v, t["o"]: out}, tuned.workspace, tuned.plan, handle=handle
    )
    return out
