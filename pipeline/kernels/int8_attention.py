"""8-bit attention from a maintained kernel library: SageAttention's INT8 QK kernels.

SageAttention (Apache-2.0, `pip install sageattention`; 1.0.6 is Triton only, no build step)
quantises each block of queries and keys to INT8 after subtracting the keys' mean over the
sequence (softmax does not change when every score of a row moves by the same amount), does
QK in INT8 and PV in FP16 with FP32 accumulation. It runs where Triton runs on an NVIDIA GPU;
head dims 64, 96 and 128.

Its distance from bf16 attention is measured at LiveAvatar's shape in
`bench/liveavatar_attention_bench.py`; frames against bf16 by `facecast gate`.
"""

from __future__ import annotations

from torch import Tensor

from pipeline.errors import ConfigError


def int8_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q kᵀ / √K) v for (B, N, L, K) queries, keys and values, QK in INT8."""
    try:
        from sageattention import sageattn  # type: ignore[import-not-found]  # optional, GPU only
    except ImportError as e:
        raise ConfigError(
            "attention 'int8' needs SageAttention: pip install 'sageattention==1.0.6'"
        ) from e
    if not q.is_cuda:
        raise ConfigError("attention 'int8' runs on an NVIDIA GPU only (Triton kernels)")
    return sageattn(q, k, v, tensor_layout="HND", is_causal=False, smooth_k=True)
