"""Flow-matching Euler sampler with timestep shift.

Convention: x_t = (1 - t) x_0 + t noise, the model predicts the velocity v = noise - x_0,
and sampling integrates from t = 1 (pure noise) to t = 0. The shift spends more of the few
steps at high noise, where structure is decided: t' = shift t / (1 + (shift - 1) t).
Frames marked known are pinned to their clean latents at every step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def shifted_timesteps(steps: int, shift: float) -> list[float]:
    ts = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    ts = shift * ts / (1 + (shift - 1) * ts)
    return ts.tolist()


def pin_known(x_BCThw: Tensor, known_BCThw: Tensor, mask_BT: Tensor) -> Tensor:
    m = mask_BT[:, None, :, None, None].to(x_BCThw.dtype)
    return x_BCThw * (1 - m) + known_BCThw * m


def sample_euler(
    velocity: Callable[[Tensor, Tensor], Tensor],
    noise_BCThw: Tensor,
    known_BCThw: Tensor,
    mask_BT: Tensor,
    steps: int,
    shift: float,
) -> Tensor:
    """Integrate dx/dt = velocity(x, t) from noise to data. Host-sync free: the timesteps
    are Python floats computed once."""
    ts = shifted_timesteps(steps, shift)
    x = pin_known(noise_BCThw, known_BCThw, mask_BT)
    B = x.shape[0]
    for t, t_next in zip(ts[:-1], ts[1:], strict=True):
        t_B = torch.full((B,), t, device=x.device, dtype=torch.float32)
        v = velocity(x, t_B)
        x = pin_known(x + (t_next - t) * v, known_BCThw, mask_BT)
    return x


def chunk_generator(seed: int, kind: str, index: int) -> torch.Generator:
    """A CPU generator for one chunk's noise: the same (seed, chunk) always gives the same
    noise, whether the audio came in one piece or streamed, and on any device."""
    kind_id = {"N": 1, "I": 2, "SR": 3}[kind]
    return torch.Generator().manual_seed((seed * 1_000_003 + kind_id * 7919 + index) % 2**63)
