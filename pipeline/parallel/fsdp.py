"""FSDP2 weight sharding for the DiTs: each transformer block is its own shard unit, so
only one block's full weights exist at a time; the next block's all-gather is started
while the current block computes (forward prefetch), and weights are freed again after
each block's forward (reshard). Optionally the shards live in pinned host memory."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from pipeline.models.layers import BlockStack
from pipeline.parallel.ulysses import SequenceParallelStack


def dit_blocks(model: nn.Module) -> list[nn.Module]:
    stack = model.transformer
    if isinstance(stack, SequenceParallelStack):  # applied first, when both are
        stack = stack.stack
    assert isinstance(stack, BlockStack), f"{type(model).__name__} has no BlockStack"
    return list(stack.blocks)


def shard_weights(
    model: nn.Module, mesh: DeviceMesh, offload: bool = False, prefetch: int = 1
) -> nn.Module:
    policy = CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy()
    blocks = [
        fully_shard(block, mesh=mesh, reshard_after_forward=True, offload_policy=policy)
        for block in dit_blocks(model)
    ]
    fully_shard(model, mesh=mesh, reshard_after_forward=True, offload_policy=policy)
    for i, block in enumerate(blocks):
        following = blocks[i + 1 : i + 1 + prefetch]
        if following:
            block.set_modules_to_forward_prefetch(following)
    return model
