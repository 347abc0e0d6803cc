"""LiveAvatar's self-attention at the release's shape, kernel by kernel (issue 31).

A block's queries (3 latent frames at 704x384: 3,168 tokens, 40 heads of 128) attend to the
sink (2,640 tokens) and the 12-frame window (12,672): 15,312 keys read as a prefix of the
step's cache buffer, as `S2VCache` hands them over. About 1 TFLOP a call, 160 calls a block
(40 layers x 4 steps): a third of the block's FLOPs.

The kernels: torch's SDPA backends, SageAttention's INT8 QK (where carried), cuDNN's FP8
attention (`pipeline.kernels.fp8_attention`, where nvidia-cudnn-frontend is installed), that
one's quantisation of q, k, v alone, and the same kernel over keys and values stored in e4m3
as an FP8 KV cache holds them (q quantised a call, or already in e4m3 as the layer makes it);
then, through cuDNN's graph API, every execution plan (engine) cuDNN offers for the shape in
bf16 and in FP8, each timed: the heuristics' first choice is not always the fastest. Each
kernel is timed (median of CUDA-event timings) and compared with an fp32 computation of the
same attention (cosine, largest difference, relative L2 error), beside bf16 SDPA's own
distance from fp32. Queries and keys are RMS-normed random rows (the model norms them before
attention) with a per-channel offset on the keys, which real keys carry and which INT8
quantisation without smoothing handles worst.

    python bench/liveavatar_attention_bench.py --json bench/results/liveavatar/attention_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench import gpu_median_ms  # noqa: E402
from pipeline.kernels.cudnn_attention import cudnn_refusal, tuned_attention  # noqa: E402
from pipeline.kernels.fp8_attention import (  # noqa: E402
    fp8_attention,
    fp8_attention_e4m3,
    fp8_attention_quantised,
    fp8_refusal,
    per_tensor_e4m3,
    to_e4m3,
)
from pipeline.kernels.int8_attention import int8_attention  # noqa: E402


def inputs(heads: int, queries: int, keys: int, cache: int, dim: int, dev: str, seed: int = 0):
    """q (1, N, Lq, K); k, v as the first `keys` rows of a (1, N, cache, K) buffer."""
    g = torch.Generator(device=dev).manual_seed(seed)

    def rms_rows(*shape: int) -> torch.Tensor:
        x = torch.randn(*shape, generator=g, device=dev)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    q = rms_rows(1, heads, queries, dim) * 1.5
    offset = torch.randn(1, heads, 1, dim, generator=g, device=dev) * 0.8
    k_buf = torch.zeros(1, heads, cache, dim, device=dev)
    k_buf[:, :, :keys] = rms_rows(1, heads, keys, dim) * 1.5 + offset
    v_buf = torch.zeros(1, heads, cache, dim, device=dev)
    v_buf[:, :, :keys] = torch.randn(1, heads, keys, dim, generator=g, device=dev)
    return q, k_buf, v_buf


def distance(out: torch.Tensor, exact: torch.Tensor) -> dict:
    o, e = out.float().flatten(), exact.flatten()
    return {
        "cosine": round(F.cosine_similarity(o, e, dim=0).item(), 7),
        "max_diff": round((o - e).abs().max().item(), 5),
        "rel_l2": round(((o - e).norm() / e.norm()).item(), 6),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=40)
    p.add_argument("--queries", type=int, default=3168)
    p.add_argument("--keys", type=int, default=2640 + 12672)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    dev = "cuda"
    cache = a.keys + a.queries  # the buffer holds a slot more than is read (its ring)
    q32, k_buf32, v_buf32 = inputs(a.heads, a.queries, a.keys, cache, a.dim, dev)
    exact = F.scaled_dot_product_attention(q32, k_buf32[:, :, : a.keys], v_buf32[:, :, : a.keys])
    q, k_buf, v_buf = (t.to(torch.bfloat16) for t in (q32, k_buf32, v_buf32))
    k, v = k_buf[:, :, : a.keys], v_buf[:, :, : a.keys]  # a view, as the cache gives it
    flops = 4 * a.heads * a.queries * a.keys * a.dim

    def sdpa(backend: SDPBackend | None):
        def run() -> torch.Tensor:
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v)

        return run

    def sage(smooth_k: bool):
        def run() -> torch.Tensor:
            from sageattention import sageattn  # where carried (its row says so otherwise)

            return sageattn(q, k, v, tensor_layout="HND", smooth_k=smooth_k)

        return run

    timing_only = {"fp8's quantisation of q, k, v alone"}
    variants = {
        "sdpa (torch's choice)": sdpa(None),
        "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "int8 (SageAttention, smooth k)": lambda: int8_attention(q, k, v),
        "SageAttention, no smoothing": sage(False),
        "cudnn (bf16, cuDNN's fastest plan for the layout, tuned at its first call)": strict(
            cudnn_refusal, tuned_attention, q, k, v
        ),
        "fp8 (cuDNN's FP8 attention, cudnn-frontend), its quantisation included": strict(
            fp8_refusal, fp8_attention, q, k, v
        ),
        # what the FP8 variant spends before its kernel: q, k, v to e4m3
        "fp8's quantisation of q, k, v alone": lambda: [to_e4m3(x)[0] for x in (q, k, v)],
        # liveavatar.kv_cache=fp8 with attention=fp8: k, v stored in e4m3 (the cache's scales:
        # 4x the largest value), only q quantised a call
        "fp8 over an FP8 KV cache (q quantised a call)": cached_fp8(q, k_buf, v_buf, a.keys),
        # with attention=fp8 and kv_cache=fp8 the layer quantises q inside its compiled half
        # and widens O in the other: the call is the kernel and its wrapper's host work
        FP8_PREQUANTISED: cached_fp8(q, k_buf, v_buf, a.keys, queries_e4m3=True),
    }
    timing_only.add(FP8_PREQUANTISED)
    # every engine cuDNN offers for this shape, bf16 and FP8 (the latter on inputs already
    # in e4m3: the kernel alone), not only the one its heuristics put first
    for fp8_inputs in (False, True):
        try:
            plans = cudnn_plans(q, k, v, fp8_inputs)
        except Exception as err:  # the wheel missing, or the graph refused: one row says so
            plans = {f"cuDNN plans ({'fp8' if fp8_inputs else 'bf16'})": _raise(err)}
        variants |= plans
        if fp8_inputs:
            timing_only |= set(plans)
    rows = time_variants(variants, exact, flops, a.repeats, timing_only)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": {"heads": a.heads, "queries": a.queries, "keys": a.keys, "dim": a.dim},
        "tflop_per_call": flops / 1e12,
        "rows": rows,
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| kernel | ms | TFLOP/s | cosine vs fp32 | max diff | rel L2 |")
    for r in rows:
        cells = [r.get(c, "–") for c in ("ms", "tflops", "cosine", "max_diff", "rel_l2")]
        print(f"| {r['kernel']} | " + " | ".join(str(c) for c in cells) + " |")


FP8_PREQUANTISED = "fp8 over an FP8 KV cache, q already in e4m3 (O left in e4m3)"


def cached_fp8(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, keys: int, queries_e4m3=False
):
    """cuDNN's FP8 attention as it reads an FP8 KV cache (`S2VCache.store`): the buffers
    rounded once with the cache's scales, a view of their first `keys` read each call; the
    queries quantised and O widened each call, or (`queries_e4m3`) neither: done in the
    layer's compiled halves (`CausalSelfAttention.fp8_queries`)."""
    from pipeline.precision import E4M3_MAX, STATIC_HEADROOM, scaled_e4m3

    stored = []
    for x in (k_buf, v_buf):
        descale = (x.abs().amax().float() * STATIC_HEADROOM / E4M3_MAX).reshape(1, 1, 1, 1)
        stored.append((scaled_e4m3(x, descale)[:, :, :keys], descale))
    (k8, dk), (v8, dv) = stored
    q8, dq = per_tensor_e4m3(q)

    def run() -> torch.Tensor:
        refusal = fp8_refusal(q)
        if refusal is not None:
            raise RuntimeError(refusal)
        if queries_e4m3:
            out8 = fp8_attention_e4m3(q8, dq, k8, v8, dk, dv)
            if isinstance(out8, str):
                raise RuntimeError(out8)
            return out8[0]
        out = fp8_attention_quantised(q, k8, v8, dk, dv)
        if isinstance(out, str):
            raise RuntimeError(out)
        return out

    return run


def strict(refusal_of, attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """A library kernel as the backend calls it (`pipeline.models.attention`), but an error
    where it cannot run or declines the shape (the row says why) instead of the fallback.
    The tuned cuDNN backend's first call tunes, outside the timing (warm-up calls first)."""

    def run() -> torch.Tensor:
        refusal = refusal_of(q)
        if refusal is not None:
            raise RuntimeError(refusal)
        out = attention(q, k, v)
        if isinstance(out, str):
            raise RuntimeError(out)
        return out

    return run


def _raise(err: Exception):
    def run():
        raise err

    return run


def cudnn_plans(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8_inputs: bool) -> dict:
    """cuDNN's attention through its graph API, one variant per execution plan its
    heuristics (modes A, B and fallback) offer for these layouts, each built and timed: is
    there a faster engine than the one torch's SDPA (bf16) or the FP8 backend (plan 0) runs?
    FP8 takes q, k, v already in e4m3, so its rows time the kernel alone."""
    import math

    import cudnn  # type: ignore[import-not-found]  # optional, GPU only

    from pipeline.kernels.cudnn_attention import cudnn_handle
    from pipeline.kernels.fp8_attention import E4M3_MAX

    handle = cudnn_handle(q.device)
    io = cudnn.data_type.FP8_E4M3 if fp8_inputs else cudnn.data_type.BFLOAT16
    fp32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=io, intermediate_data_type=fp32, compute_data_type=fp32, handle=handle
    )
    data = dict(zip("qkv", (q, k, v), strict=True))
    if fp8_inputs:
        data = {name: to_e4m3(x)[0] for name, x in data.items()}
    t = {
        name: graph.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=io)
        for name, x in data.items()
    }
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(data["q"])
    pack = {t[name]: x for name, x in data.items()}
    if fp8_inputs:
        one = torch.ones(1, 1, 1, 1, device=q.device)
        scalars = {
            "descale_q": one, "descale_k": one, "descale_v": one, "descale_s": one / E4M3_MAX,
            "scale_s": one * E4M3_MAX, "scale_o": one,
        }  # fmt: skip
        for name, x in scalars.items():
            t[name] = graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32)
            pack[t[name]] = x
        o, _, amax_s, amax_o = graph.sdpa_fp8(
            q=t["q"], k=t["k"], v=t["v"], is_inference=True, attn_scale=scale,
            use_causal_mask=False, name="fp8",
            **{name: t[name] for name in scalars},
        )  # fmt: skip
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
            pack[amax] = torch.empty_like(one)
    else:
        o, _ = graph.sdpa(
            q=t["q"], k=t["k"], v=t["v"], is_inference=True, attn_scale=scale,
            use_causal_mask=False, name="bf16",
        )  # fmt: skip
    o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(io)
    pack[o] = out
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    kind = "fp8 (inputs in e4m3)" if fp8_inputs else "bf16"
    variants = {}
    for i in range(graph.get_execution_plan_count()):
        name = f"cuDNN {kind} plan {i}"
        try:
            graph.build_plan_at_index(i)
            name += f" ({graph.get_plan_name_at_index(i)})"
            workspace = torch.empty(
                graph.get_workspace_size_plan_at_index(i), device=q.device, dtype=torch.uint8
            )
        except Exception as err:  # a plan that does not build: its row says why
            variants[name] = _raise(err)
            continue

        def run(i=i, workspace=workspace) -> torch.Tensor:
            cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
            graph.execute_plan_at_index(pack, workspace, i, handle=handle)
            return out

        variants[name] = run
    return variants


def time_variants(
    variants: dict, exact: torch.Tensor, flops: int, repeats: int, timing_only: set
) -> list:
    """Each variant timed and, unless it is a part timed alone, its distance from fp32."""
    rows: list[dict] = []
    with torch.inference_mode():
        for name, fn in variants.items():
            try:
                ms, out = gpu_median_ms(fn, repeats)
            except Exception as err:  # one kernel failing must not hide the others
                rows.append({"kernel": name, "error": f"{type(err).__name__}: {err}"[:300]})
            else:
                rows.append({"kernel": name, "ms": round(ms, 3)})
                if name not in timing_only:
                    rows[-1]["tflops"] = round(flops / ms / 1e9, 1)
                    rows[-1].update(distance(out, exact))
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
