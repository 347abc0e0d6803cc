"""Host → device copies that do not stall the host.

A plain `cpu_tensor.to("cuda")` from pageable memory returns only once the copy is done,
and the copy waits for every kernel queued before it: a hidden host sync in the middle of a
chunk, after which the GPU idles while the host queues the next kernels. Staging through
pinned memory (PyTorch's caching host allocator keeps the buffer alive until the copy has
run) makes the copy asynchronous, so the host keeps queueing work ahead of the GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(x_cpu: Tensor, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """Copy a CPU tensor to `device` (then cast there: the same rounding as on the CPU)."""
    if device.type == "cuda":
        out = x_cpu.pin_memory().to(device, non_blocking=True)
    else:
        out = x_cpu.to(device)
    return out if dtype is None else out.to(dtype)
