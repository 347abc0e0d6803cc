"""LiveAvatar's self-attention at the release's shape, kernel by kernel (issue 31).

A block's queries (3 latent frames at 704x384: 3,168 tokens, 40 heads of 128) attend to the
sink (2,640 tokens) and the 12-frame window (12,672): 15,312 keys read as a prefix of the
step's cache buffer, as `S2VCache` hands them over. About 1 TFLOP a call, 160 calls a block
(40 layers x 4 steps): a third of the block's FLOPs.

The kernels: torch's SDPA backends, SageAttention's INT8 QK (where carried), cuDNN's FP8
attention (`pipeline.kernels.fp8_attention`, where nvidia-cudnn-frontend is installed), and
that one's quantisation of q, k, v alone. Each kernel is timed (median of CUDA-event
timings) and compared with an fp32 computation of the same attention (cosine, largest
difference, relative L2 error), beside bf16 SDPA's own distance from fp32. Queries and keys are RMS-normed random rows (the model norms them before
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
from pipeline.kernels.fp8_attention import fp8_attention, fp8_refusal, to_e4m3  # noqa: E402
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
        "fp8 (cuDNN's FP8 attention, cudnn-frontend), its quantisation included": fp8(q, k, v),
        # what the FP8 variant spends before its kernel: q, k, v to e4m3
        "fp8's quantisation of q, k, v alone": lambda: [to_e4m3(x)[0] for x in (q, k, v)],
    }
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


def fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """cuDNN's FP8 attention, its per-call quantisation included; an error where it cannot
    run (the row says why)."""

    def run() -> torch.Tensor:
        refusal = fp8_refusal(q)
        if refusal is not None:
            raise RuntimeError(refusal)
        out = fp8_attention(q, k, v)
        if isinstance(out, str):
            raise RuntimeError(out)
        return out

    return run


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
