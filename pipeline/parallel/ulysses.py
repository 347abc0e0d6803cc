"""Ulysses sequence parallelism with pipelined head groups.

Each rank holds L/P tokens of every sequence. Around each attention an all-to-all trades the
sequence shard for a head shard (all L tokens, N/P heads), attention runs on the full
sequence — so token order, and with it the SR frame-window mask, is unchanged — and a
second all-to-all trades back. Heads are split into G groups: every group's forward
all-to-all is issued at once, then group g's attention runs while later groups are still in
flight, and its return all-to-all is issued immediately, so transfers hide behind compute.

Legend: B batch, N heads, L tokens (full), S = L/P local tokens, H head dim, P ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pipeline.models.attention import FrameWindow
from pipeline.models.layers import BlockStack, DiTBlock


def _seq_to_heads(x_BNSH: Tensor, world: int) -> Tensor:
    """Pack (B, n, S, H) so all_to_all_single's dim-0 split sends head block p to rank p."""
    B, n, S, H = x_BNSH.shape
    return x_BNSH.reshape(B, world, n // world, S, H).transpose(0, 1).contiguous()


def _heads_to_seq(x_PBnSH: Tensor) -> Tensor:
    """Received (P, B, n/P, S, H) — rank p's tokens in block p — → (B, n/P, P*S, H)."""
    P, B, n, S, H = x_PBnSH.shape
    return x_PBnSH.permute(1, 2, 0, 3, 4).reshape(B, n, P * S, H)


def _back_to_seq_shard(o_BnLH: Tensor, world: int) -> Tensor:
    """(B, n/P, L, H) → packed (P, B, n/P, S, H): token block p goes back to rank p."""
    B, n, L, H = o_BnLH.shape
    return o_BnLH.reshape(B, n, world, L // world, H).permute(2, 0, 1, 3, 4).contiguous()


class UlyssesAttention(nn.Module):
    def __init__(self, inner: nn.Module, group: dist.ProcessGroup, head_groups: int = 1):
        super().__init__()
        self.inner = inner
        self.group = group
        self.world = dist.get_world_size(group)
        self.head_groups = head_groups

    def forward(self, q: Tensor, k: Tensor, v: Tensor, window: FrameWindow | None = None):
        B, N, S, H = q.shape
        P, G = self.world, self.head_groups
        if N % (P * G):
            raise ValueError(f"{N} heads do not split over {P} ranks x {G} head groups")
        n = N // G
        # 1) issue every group's sequence→head all-to-all up front
        sent = []
        for g in range(G):
            qkv = torch.stack([t[:, g * n : (g + 1) * n] for t in (q, k, v)])  # (3, B, n, S, H)
            packed = _seq_to_heads(qkv.flatten(0, 1), P)  # (P, 3B, n/P, S, H)
            recv = torch.empty_like(packed)
            work = dist.all_to_all_single(recv, packed, group=self.group, async_op=True)
            sent.append((work, recv))
        # 2) attention per group as its data lands; its return trip starts right away
        back = []
        for work, recv in sent:
            work.wait()
            qg, kg, vg = _heads_to_seq(recv).unflatten(0, (3, B)).unbind(0)  # (B, n/P, L, H)
            o = self.inner(qg, kg, vg, window)
            packed = _back_to_seq_shard(o, P)
            out = torch.empty_like(packed)
            back.append((dist.all_to_all_single(out, packed, group=self.group, async_op=True), out))
        # 3) reassemble heads: group g's heads from every rank, for our own tokens
        outs = []
        for work, out in back:
            work.wait()
            outs.append(out.permute(1, 0, 2, 3, 4).reshape(B, n, S, H))  # (B, n, S, H)
        return torch.cat(outs, dim=1)


class SequenceParallelStack(nn.Module):
    """Runs a BlockStack on this rank's slice of the tokens, then gathers the full sequence."""

    def __init__(self, stack: BlockStack, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.stack = stack
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def forward(self, x_BLD, mod_B6D, rope, window=None, cond_BLD=None):
        L = x_BLD.shape[1]
        if L % self.world:
            raise ValueError(f"{L} tokens do not split evenly over {self.world} ranks")
        S = L // self.world
        sl = slice(self.rank * S, (self.rank + 1) * S)
        cos, sin = rope
        local = self.stack(
            x_BLD[:, sl],
            mod_B6D,
            (cos[sl], sin[sl]),
            window,
            None if cond_BLD is None else cond_BLD[:, sl],
        )
        parts = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)


def parallelize_sequence(model: nn.Module, group: dist.ProcessGroup, head_groups: int = 1):
    """Turn a DiT (anything with a `.transformer` BlockStack) sequence-parallel in place."""
    stack = model.transformer
    if not isinstance(stack, BlockStack):
        raise TypeError(
            f"{type(model).__name__}.transformer is {type(stack).__name__}: only a "
            "BlockStack is made sequence-parallel, and only once"
        )
    for block in stack.blocks:
        assert isinstance(block, DiTBlock)
        block.attn.attend = UlyssesAttention(block.attn.attend, group, head_groups)
    model.transformer = SequenceParallelStack(stack, group)
    return model
