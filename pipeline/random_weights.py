"""Random weights of a published model's shapes, the same for a seed on every machine.

Tests, the parity scripts and the benchmarks run the real models' code paths on random
weights instead of downloads. `random_value` draws one tensor by its name's role (no zero
or one left anywhere: such paths hide bugs); `randomise_module` draws every tensor of a
built module anew (a transformers wav2vec2, a diffusers VAE). Each family's key table
(its `weights.py`) lays the values out as its release does; `pipeline.checkpoints` writes
and reads them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def random_value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
    """One random tensor by its name's role: matrices ~ N(0, 1/fan_in), norm gains
    ~ 1 + N(0, 0.1²), other vectors (biases) ~ N(0, 0.02²), modulation tables ~ N(0, 1/dim)."""
    noise = torch.randn(shape, generator=gen, device=gen.device)  # drawn where gen lives
    if name.endswith("modulation"):
        return noise / math.sqrt(shape[-1])
    if name.endswith("gamma") or (len(shape) == 1 and name.endswith("weight")):
        return 1.0 + 0.1 * noise
    if len(shape) <= 1:
        return 0.02 * noise
    return noise / math.sqrt(math.prod(shape[1:]))


def randomise_module(module: torch.nn.Module, seed: int) -> None:
    """Every floating parameter and buffer of `module` drawn anew, in name order from a CPU
    generator: the same values for a seed on any machine and library version that names
    the tensors the same (wav2vec2 models, VAEs, in tests and the parity scripts)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    with torch.no_grad():
        for name in sorted(tensors):
            t = tensors[name]
            if t.is_floating_point():
                t.copy_(random_value(name, tuple(t.shape), gen))
