"""8-bit attention from a maintained kernel library: SageAttention's INT8 QK kernels.

SageAttention (Apache-2.0, `pip install sageattention`; 1.0.6 is Triton only, no build step)
quantises each block of queries and keys to INT8 after subtracting the keys' mean over the
sequence (softmax does not change when every score of a row moves by the same amount), does
QK in INT8 and PV in FP16 with FP32 accumulation. It runs where Triton runs on an NVIDIA GPU;
head dims 64, 96 and 128. Queries it cannot take (a CPU, another head dim or dtype, the
library missing) go to torch's exact SDPA instead, with one log line a reason.

Its distance from bf16 attention is measured at LiveAvatar's shape in
`bench/liveavatar_attention_bench.py`; frames against bf16 by `facecast gate`.
"""

from __future__ import annotations

import functools
from importlib.util import find_spec

import torch
from torch import Tensor

HEAD_DIMS = (64, 96, 128)  # what SageAttention 1.0.6's kernels are built for


@functools.cache
def _installed() -> bool:
    return find_spec("sageattention") is not None


def int8_refusal(q: Tensor) -> str | None:
    """Why the INT8 kernels cannot take these (B, N, L, K) queries, or None where they can."""
    if not q.is_cuda:
        return "it runs on an NVIDIA GPU only (Triton kernels)"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]} is not one of its {HEAD_DIMS}"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"it takes float16 or bfloat16, not {q.dtype}"
    if not _installed():
        return "SageAttention is not installed (pip install 'sageattention==1.0.6')"
    return None


def int8_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q kᵀ / √K) v for (B, N, L, K) queries, keys and values, QK in INT8, where
    `int8_refusal(q)` is None (the caller falls back to the exact path otherwise)."""
    from sageattention import sageattn  # type: ignore[import-not-found]  # optional, GPU only

    return sageattn(q, k, v, tensor_layout="HND", is_causal=False, smooth_k=True)
