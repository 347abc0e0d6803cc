"""How far FP8 attention lands from fp32 at LiveAvatar's shape, emulated on a CPU (issue 31).

cuDNN's FP8 attention on Hopper (`pipeline.kernels.fp8_attention`) takes q, k and v in e4m3,
each under one scale, holds the softmax's probabilities in e4m3 scaled by 448, and writes O
in e4m3 under v's scale. This script does the same rounding in fp32 arithmetic, one source
of rounding at a time and all together, on the inputs `liveavatar_attention_bench.py` uses
(RMS-normed queries and keys with a per-channel offset on the keys; a few of the 40 heads),
beside bf16 SDPA's own distance from fp32. It tells, before any GPU time, how close the
kernel can be at best; the kernel's own numbers come from the attention bench on the H200.

    python bench/fp8_attention_numerics.py --heads 4 --json bench/results/liveavatar/fp8_attention_numerics_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from liveavatar_attention_bench import distance, inputs  # noqa: E402

E4M3_MAX = 448.0


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x through e4m3 under one scale (its absolute maximum at 448), back in fp32."""
    descale = x.abs().amax() / E4M3_MAX
    return (x / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * descale


def attention(q, k, v, p_in_e4m3: bool = False, o_in_e4m3: bool = False) -> torch.Tensor:
    """softmax(q kᵀ / √K) v in fp32, the probabilities (at most 1 after the row's maximum, as
    in a flash kernel) and the output optionally rounded as the FP8 kernel rounds them."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    p = torch.exp(s - s.amax(-1, keepdim=True))
    total = p.sum(-1, keepdim=True)
    if p_in_e4m3:
        p = (p * E4M3_MAX).to(torch.float8_e4m3fn).float() / E4M3_MAX
    o = p @ v / total
    if o_in_e4m3:  # under v's scale: O is a convex combination of v's rows
        descale = v.abs().amax() / E4M3_MAX
        o = (o / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * descale
    return o


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=4, help="of LiveAvatar's 40 (CPU time)")
    p.add_argument("--queries", type=int, default=3168)
    p.add_argument("--keys", type=int, default=2640 + 12672)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    q32, k32, v32 = inputs(a.heads, a.queries, a.keys, a.keys, 128, "cpu")
    exact = F.scaled_dot_product_attention(q32, k32, v32)
    q, k, v = (t.bfloat16().float() for t in (q32, k32, v32))  # what the model hands over
    q8, k8, v8 = rounded(q), rounded(k), rounded(v)
    k_smooth = rounded(k - k.mean(dim=-2, keepdim=True))  # softmax does not change
    bf16 = F.scaled_dot_product_attention(*(t.bfloat16() for t in (q32, k32, v32))).float()
    rows = {
        "bf16 SDPA (torch's)": bf16,
        "q, k in e4m3": attention(q8, k8, v),
        "v in e4m3": attention(q, k, v8),
        "probabilities in e4m3": attention(q, k, v, p_in_e4m3=True),
        "all of it (cuDNN's FP8 kernel as used)": attention(q8, k8, v8, True, True),
        "all of it, keys smoothed first": attention(q8, k_smooth, v8, True, True),
    }
    result = {name: distance(out, exact) for name, out in rows.items()}
    for name, d in result.items():
        print(f"| {name} | {d['cosine']} | {d['max_diff']} | {d['rel_l2']} |")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        shape = {"heads": a.heads, "queries": a.queries, "keys": a.keys, "dim": 128}
        a.json.write_text(json.dumps({"shape": shape, "rows": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
