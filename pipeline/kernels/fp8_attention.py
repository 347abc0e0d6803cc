"""8-bit attention from a maintained kernel library: cuDNN's FP8 fused attention on Hopper.

cuDNN (already under torch on every CUDA install) has a fused FP8 attention forward for
Hopper; its Python graph API comes in NVIDIA's `nvidia-cudnn-frontend` wheel (`pip install
'nvidia-cudnn-frontend==1.16.0'`: 2 MB, no other dependency; it opens the libcudnn torch
ships). QK and PV run on the FP8 tensor cores with FP32 accumulation.

Each call scales q, k and v to e4m3 by one scale each (their absolute maximum / 448, kept on
the GPU: no host sync). The softmax's probabilities, at most 1 after the kernel's running
maximum, are held in e4m3 scaled by 448. Hopper's kernel writes O in e4m3 too; O is a convex
combination of v's rows, so v's scale bounds it, and it is widened back to the queries'
dtype. Queries it cannot take (a CPU, an older GPU, another dtype or head dim, the wheel
missing, a shape cuDNN declines) go to torch's exact SDPA instead, with one log line a
reason.

Its speed and its distance from bf16 at LiveAvatar's shape are measured in
`bench/liveavatar_attention_bench.py`; frames against bf16 by `facecast gate`. LiveAvatar's
layers and FlashHead's blocks quantise their own inputs where they are made, inside their
compiled code (`per_tensor_e4m3`; FlashHead's per stream of a batch, `per_sample_e4m3`), and
call the kernel alone (`fp8_attention_e4m3`, through `pipeline.models.attention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pipeline.kernels.cudnn_attention import cudnn_handle, cudnn_refusal
from pipeline.precision import E4M3_MAX, scaled_e4m3, widened_e4m3

HEAD_DIMS = (64, 128)  # what cuDNN's FP8 forward kernels are built for on Hopper


def fp8_refusal(q: Tensor) -> str | None:
    """Why cuDNN's FP8 attention cannot take these (B, N, L, K) queries, or None: what any
    cuDNN attention here needs (`cudnn_refusal`), then Hopper and its FP8 head dims."""
    if (refusal := cudnn_refusal(q)) is not None:
        return refusal
    if torch.cuda.get_device_capability(q.device) < (9, 0):
        return "it needs a Hopper GPU or newer (compute capability 9.0)"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]} is not one of its {HEAD_DIMS}"
    return None


@dataclass
class _Plan:
    """One built cuDNN graph for one layout of q, k, v, and what executing it needs."""

    graph: Any
    tensors: dict[str, Any]  # name → the graph's tensor
    workspace: Tensor
    fixed: dict[str, Tensor]  # the same every call: P's scales, the unread amax outputs


Layout = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, stride)
_plans: dict[tuple, _Plan | str] = {}  # layouts → a plan, or why cuDNN declined them


def _build(device: torch.device, q: Layout, k: Layout, v: Layout, o: Layout) -> _Plan:
    import cudnn  # type: ignore[import-not-found]  # optional, GPU only

    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=e4m3,
        intermediate_data_type=fp32,
        compute_data_type=fp32,
        handle=cudnn_handle(device),
    )
    t = {
        name: graph.tensor(name=name, dim=list(shape), stride=list(stride), data_type=e4m3)
        for name, (shape, stride) in (("q", q), ("k", k), ("v", v))
    }
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        t[name] = graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32)
    out, _, amax_s, amax_o = graph.sdpa_fp8(
        q=t["q"],
        k=t["k"],
        v=t["v"],
        descale_q=t["descale_q"],
        descale_k=t["descale_k"],
        descale_v=t["descale_v"],
        descale_s=t["descale_s"],
        scale_s=t["scale_s"],
        scale_o=t["scale_o"],
        is_inference=True,
        attn_scale=1.0 / math.sqrt(q[0][-1]),
        use_causal_mask=False,
        name="fp8_attention",
    )
    # Hopper's FP8 kernels write O in e4m3 (bf16 O is Blackwell's)
    out.set_output(True).set_dim(list(o[0])).set_stride(list(o[1])).set_data_type(e4m3)
    for amax in (amax_s, amax_o):
        amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
    t |= {"o": out, "amax_s": amax_s, "amax_o": amax_o}
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    one = torch.ones(1, 1, 1, 1, device=device)
    fixed = {
        "descale_s": one / E4M3_MAX,  # the probabilities, at most 1, times 448
        "scale_s": one * E4M3_MAX,
        "amax_s": torch.empty_like(one),
        "amax_o": torch.empty_like(one),
    }
    return _Plan(graph, t, workspace, fixed)


def _plan(q8: Tensor, k8: Tensor, v8: Tensor) -> _Plan | str:
    """The plan for these layouts, built once; or why cuDNN declined them (said once)."""
    q, k, v = ((tuple(x.shape), tuple(x.stride())) for x in (q8, k8, v8))
    key = (q8.device, q, k, v)
    if key not in _plans:
        try:
            _plans[key] = _build(q8.device, q, k, v, q)  # O in q's layout
        except Exception as err:  # cuDNN's "not supported" comes as several error types
            _plans[key] = f"cuDNN declined q {q[0]}, k {k[0]}: {err}"[:300]
    return _plans[key]


def per_tensor_e4m3(x: Tensor) -> tuple[Tensor, Tensor]:
    """x scaled into e4m3 by one scale (its absolute maximum / 448), and that scale's
    inverse (the descale, (1, 1, 1, 1) fp32), both computed on the GPU. Plain torch: a
    compiled layer calls it inside its own graph (LiveAvatar's queries, fused with RoPE)."""
    descale = (x.abs().amax().float() / E4M3_MAX).clamp(min=1e-12).reshape(1, 1, 1, 1)
    return scaled_e4m3(x, descale), descale


to_e4m3 = torch.compile(per_tensor_e4m3, dynamic=True)


def per_sample_e4m3(x: Tensor) -> tuple[Tensor, Tensor]:
    """(B, ...) `x` scaled into e4m3 by one scale per sample (its absolute maximum / 448),
    and those scales' inverses, (B, 1, 1, 1) fp32: batched streams' values never set each
    other's rounding (FlashHead's q, k and v, one batch of sessions)."""
    amax = x.abs().amax(dim=tuple(range(1, x.dim())), keepdim=True).float()
    descale = (amax / E4M3_MAX).clamp(min=1e-12)
    return scaled_e4m3(x, descale), descale


def fp8_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor | str:
    """softmax(q kᵀ / √K) v for (B, N, L, K) queries, keys and values in FP8, where
    `fp8_refusal(q)` is None; a string (why cuDNN declined the shape) where it cannot, for
    the caller to fall back on the exact path."""
    k8, descale_k = to_e4m3(k)
    v8, descale_v = to_e4m3(v)
    return fp8_attention_quantised(q, k8, v8, descale_k, descale_v)


def fp8_attention_quantised(
    q: Tensor, k8: Tensor, v8: Tensor, descale_k: Tensor, descale_v: Tensor
) -> Tensor | str:
    """The same, over keys and values already in e4m3 with their descales ((1, 1, 1, 1)
    fp32): only the queries are quantised here (an FP8 KV cache keeps k and v so)."""
    q8, descale_q = to_e4m3(q)
    out = fp8_attention_e4m3(q8, descale_q, k8, v8, descale_k, descale_v)
    if isinstance(out, str):
        return out
    o8, descale_o = out
    return widened_e4m3(o8, descale_o, q.dtype)


def fp8_attention_e4m3(
    q8: Tensor, descale_q: Tensor, k8: Tensor, v8: Tensor, descale_k: Tensor, descale_v: Tensor
) -> tuple[Tensor, Tensor] | str:
    """The kernel alone: queries, keys and values all in e4m3 with their descales; O in e4m3
    (q8's layout) and its descale, for the caller to widen where it fuses best (LiveAvatar:
    in the layer's compiled half, with the reshape before the output projection). A string
    where cuDNN declines the layouts."""
    import cudnn

    plan = _plan(q8, k8, v8)
    if isinstance(plan, str):
        return plan
    o8 = torch.empty_like(q8)  # q's layout: (B, N, L, K) as a view of (B, L, N, K) stays one
    t = plan.tensors
    handle = cudnn_handle(q8.device)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(q8.device).cuda_stream)
    plan.graph.execute(
        {
            t["q"]: q8,
            t["k"]: k8,
            t["v"]: v8,
            t["descale_q"]: descale_q,
            t["descale_k"]: descale_k,
            t["descale_v"]: descale_v,
            t["scale_o"]: 1.0 / descale_v,  # |O| <= max |v|: v's scale fits O
            t["o"]: o8,
            **{t[name]: x for name, x in plan.fixed.items()},
        },
        plan.workspace,
        handle=handle,
    )
    return o8, descale_v
