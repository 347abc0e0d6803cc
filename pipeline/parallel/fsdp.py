"""FSDP2 weight sharding for the DiTs: each transformer block is its own shard unit, so
only one block's full weights exist at a time; the next block's all-gather is started
while the current block computes (forward prefetch), and weights are freed again after
each block's forward (reshard). Optionally the shards live in pinned host memory."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard


def dit_blocks(model: nn.Module) -> list[nn.Module]:
    stack = model.transformer
    stack = getattr(stack, "stack", stack)  # sequence-parallel wrapper, if applied
    return list(stack.blocks)


def shard_weights(
    model: nn.Module, mesh: DeviceMesh, offload: bool = False, prefetch: int = 1
) -> nn.Module:
    policy = CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy()
    blocks = dit_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True, offload_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=True, offload_policy=policy)
    for i, block in enumerate(blocks):
        following = blocks[i + 1 : i + 1 + prefetch]
        if following:
            block.set_modules_to_forward_prefetch(following)
    return model
