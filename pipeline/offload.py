"""Offload manager: DiT block weights live in pinned host memory and stream onto the GPU.

Applied from outside the model code (seed 000, §2 of DESIGN.md): `OffloadManager.attach`
takes a model's `BlockStack` and installs forward pre-hooks on its blocks. Each block's
parameters are packed into one flat pinned host buffer (one DMA per block). Before block n
runs, its copy must be done; the hook then starts the copies of blocks n+1 .. n+prefetch on
a separate copy stream, so block n+1's copy overlaps block n's compute. Wrap-around
prefetch (after the last block, block 0 of the same stack) serves the sampler's next step.

Loaded blocks stay on the GPU while they fit in `budget_bytes`. When a copy would go over,
blocks of other stacks are evicted first, least recently used first (the outgoing model is
unloaded asynchronously: weights are read-only, so unloading is only dropping the GPU copy;
`record_stream` keeps the allocator from reusing it before the last kernel that reads it
has run). If the stack itself does not fit, its most recently used block goes: in a cyclic
pass that is the block needed last, which keeps the head of the stack resident.

On the CPU (tests) the same code path runs with plain (unpinned) host buffers, no streams
and synchronous copies, so outputs with offload on and off are identical.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

log = logging.getLogger("facecast.offload")


@dataclass
class OffloadConfig:
    prefetch: int = 2  # blocks whose copy is started ahead of the one computing
    # GPU bytes all offloaded blocks may hold; None: room for 2 + prefetch blocks
    budget_gb: float | None = None
    pin_memory: bool = True  # pinned host buffers where CUDA is available (55 vs 20 GB/s)
    record_stalls: bool = False  # keep events around each wait (for the benchmark)


@dataclass
class StallRecord:
    stack: str
    block: int
    before: torch.cuda.Event
    after: torch.cuda.Event


@dataclass
class _Block:
    stack: str
    index: int
    module: nn.Module
    params: list[tuple[nn.Parameter, int, int]]  # (param, offset, numel) in the flat buffer
    host: Tensor  # flat, pinned when possible
    device_buf: Tensor | None = None
    ready: torch.cuda.Event | None = None  # set once the copy is issued (CUDA only)

    @property
    def nbytes(self) -> int:
        return self.host.numel() * self.host.element_size()


@dataclass
class OffloadStats:
    loads: int = 0
    evictions: int = 0
    bytes_copied: int = 0
    stalls: list[StallRecord] = field(default_factory=list)


class OffloadManager:
    """Owns the offloaded blocks of any number of block stacks on one device."""

    def __init__(self, device: torch.device | str, cfg: OffloadConfig | None = None) -> None:
        self.device = torch.device(device)
        self.cfg = cfg or OffloadConfig()
        self.is_cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.is_cuda else None
        self.stacks: dict[str, list[_Block]] = {}
        self.resident: OrderedDict[tuple[str, int], _Block] = OrderedDict()  # LRU order
        self.stats = OffloadStats()
        self._budget: int | None = None
        self._handles: list = []

    # -- setup ----------------------------------------------------------------------------
    def attach(self, name: str, blocks: nn.ModuleList) -> None:
        """Move every block's weights to one flat host buffer and hook its forward."""
        pin = self.cfg.pin_memory and self.is_cuda
        entries = [self._pack(name, i, block, pin) for i, block in enumerate(blocks)]
        self.stacks[name] = entries
        self.hook_stack(name, blocks)
        log.info(
            "offload: %s, %d blocks, %.2f GB in %s host memory",
            name,
            len(entries),
            sum(b.nbytes for b in entries) / 1e9,
            "pinned" if pin else "pageable",
        )

    def add_block(self, stack: str, index: int, block: nn.Module) -> None:
        """Pack one block into host memory now (building block by block); hook it later."""
        assert index == len(self.stacks.get(stack, [])), "blocks are added in order"
        pin = self.cfg.pin_memory and self.is_cuda
        self.stacks.setdefault(stack, []).append(self._pack(stack, index, block, pin))

    def hook_stack(self, stack: str, blocks: nn.ModuleList) -> None:
        for i, block in enumerate(blocks):
            self._handles.append(block.register_forward_pre_hook(self._make_hook(stack, i)))

    def _pack(self, stack: str, index: int, block: nn.Module, pin: bool) -> _Block:
        params = list(block.parameters())
        dtypes = {p.dtype for p in params}
        assert len(dtypes) == 1, f"one dtype per block expected, got {dtypes}"
        total = sum(p.numel() for p in params)
        host = torch.empty(total, dtype=params[0].dtype, device="cpu", pin_memory=pin)
        layout, offset = [], 0
        for p in params:
            n = p.numel()
            host[offset : offset + n].copy_(p.data.reshape(-1))
            p.data = host[offset : offset + n].view_as(p)
            layout.append((p, offset, n))
            offset += n
        return _Block(stack, index, block, layout, host)

    @property
    def budget(self) -> int:
        if self._budget is None:
            if self.cfg.budget_gb is not None:
                self._budget = int(self.cfg.budget_gb * 1e9)
            else:
                biggest = max(b.nbytes for s in self.stacks.values() for b in s)
                self._budget = (2 + self.cfg.prefetch) * biggest
        return self._budget

    def detach(self) -> None:
        """Remove the hooks and bring every block back to the GPU for good (tests, switching off)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for blocks in self.stacks.values():
            for b in blocks:
                if b.device_buf is None:
                    self._issue_copy(b)
                self._bind(b)
                b.device_buf = None  # the parameters now own the memory
        if self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        self.stacks.clear()
        self.resident.clear()

    # -- the hot path ---------------------------------------------------------------------
    def _make_hook(self, stack: str, index: int):
        def pre_hook(module: nn.Module, args) -> None:
            self.before_block(stack, index)

        return pre_hook

    def before_block(self, stack: str, index: int) -> None:
        blocks = self.stacks[stack]
        block = blocks[index]
        protect = {(stack, (index + j) % len(blocks)) for j in range(self.cfg.prefetch + 1)}
        if block.device_buf is None:
            self._load(block, protect)
        self._wait(block)
        self.resident.move_to_end((stack, index))
        for j in range(1, self.cfg.prefetch + 1):
            nxt = blocks[(index + j) % len(blocks)]
            if nxt.device_buf is None:
                self._load(nxt, protect)

    def _load(self, block: _Block, protect: set[tuple[str, int]]) -> None:
        self._make_room(block, protect)
        self._issue_copy(block)
        self.resident[(block.stack, block.index)] = block
        self.stats.loads += 1
        self.stats.bytes_copied += block.nbytes

    def _issue_copy(self, block: _Block) -> None:
        if not self.is_cuda:
            block.device_buf = block.host.to(self.device, copy=True)
            return
        with torch.cuda.stream(self.copy_stream):
            # allocated on the copy stream; the compute stream's later use is recorded in _wait
            buf = torch.empty(block.host.shape, dtype=block.host.dtype, device=self.device)
            buf.copy_(block.host, non_blocking=True)
            block.ready = torch.cuda.Event()
            block.ready.record(self.copy_stream)
        block.device_buf = buf

    def _wait(self, block: _Block) -> None:
        if self.is_cuda and block.ready is not None:
            compute = torch.cuda.current_stream(self.device)
            if self.cfg.record_stalls:
                before = torch.cuda.Event(enable_timing=True)
                after = torch.cuda.Event(enable_timing=True)
                before.record(compute)
            # the block's weights must have landed before its first kernel reads them
            compute.wait_event(block.ready)
            if self.cfg.record_stalls:
                after.record(compute)
                self.stats.stalls.append(StallRecord(block.stack, block.index, before, after))
            assert block.device_buf is not None, "a copy was issued for this block"
            block.device_buf.record_stream(compute)
            block.ready = None
        self._bind(block)

    def _bind(self, block: _Block) -> None:
        buf = block.device_buf
        assert buf is not None, "a block is bound only once its copy is issued"
        for p, offset, n in block.params:
            p.data = buf[offset : offset + n].view_as(p)

    def _make_room(self, incoming: _Block, protect: set[tuple[str, int]]) -> None:
        used = sum(b.nbytes for b in self.resident.values())
        while used + incoming.nbytes > self.budget:
            victim = self._pick_victim(incoming.stack, protect)
            if victim is None:
                break  # everything left is needed now: go over budget rather than deadlock
            used -= victim.nbytes
            self._evict(victim)

    def _pick_victim(self, stack: str, protect: set[tuple[str, int]]) -> _Block | None:
        for key, b in self.resident.items():  # least recently used first
            if b.stack != stack and key not in protect:
                return b
        for key, b in reversed(self.resident.items()):  # own stack: most recently used first
            if key not in protect:
                return b
        return None

    def _evict(self, block: _Block) -> None:
        del self.resident[(block.stack, block.index)]
        for p, offset, n in block.params:
            p.data = block.host[offset : offset + n].view_as(p)
        # no copy back (weights are read-only) and no sync: the allocator reuses the memory
        # only after the kernels recorded on it in _wait have run
        block.device_buf = None
        block.ready = None
        self.stats.evictions += 1

    # -- stage hand-over ------------------------------------------------------------------
    def prefetch_stack(self, stack: str) -> None:
        """Start copying the first blocks of `stack` now (e.g. while the previous stage runs)."""
        blocks = self.stacks[stack]
        protect = {(stack, j % len(blocks)) for j in range(self.cfg.prefetch + 1)}
        for j in range(min(self.cfg.prefetch + 1, len(blocks))):
            if blocks[j].device_buf is None:
                self._load(blocks[j], protect)

    def release_stack(self, stack: str) -> None:
        """Unload a stack's blocks now (asynchronously: no host sync)."""
        for b in self.stacks[stack]:
            if b.device_buf is not None:
                self._evict(b)

    def resident_bytes(self) -> int:
        return sum(b.nbytes for b in self.resident.values())

    def host_bytes(self) -> int:
        return sum(b.nbytes for s in self.stacks.values() for b in s)


# -- building models that do not fit ----------------------------------------------------------
def materialize_blockwise(
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    manager: OffloadManager | None,
    stack: str,
) -> nn.Module:
    """A DiT built on the meta device → random weights on `device`, one block at a time.

    The full fp32 model never exists anywhere: each block is initialised on the device in
    fp32, cast to `dtype`, and (with a manager) packed into pinned host memory before the
    next one is made. For speed benchmarks of configs too large to build whole; the values
    differ from `build_models`' CPU-seeded init (same distributions).
    """
    transformer = model.get_submodule("transformer")
    blocks = transformer.get_submodule("blocks")
    assert isinstance(blocks, nn.ModuleList)
    transformer.blocks = nn.ModuleList()
    model.to_empty(device=device)
    _init_random(model, seed)
    model.to(dtype)
    for i, block in enumerate(blocks):
        block.to_empty(device=device)
        _init_random(block, seed * 1000 + i + 1)
        block.to(dtype)
        if manager is not None:
            manager.add_block(stack, i, block)
    transformer.blocks = blocks
    if manager is not None:
        manager.hook_stack(stack, blocks)
    return model


@torch.no_grad()
def _init_random(module: nn.Module, seed: int) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in module.modules():
            reset = getattr(m, "reset_parameters", None)
            if callable(reset):
                reset()
                continue
            for name, p in m.named_parameters(recurse=False):
                if "modulation" in name:
                    p.normal_(0.0, p.shape[-1] ** -0.5)
                else:
                    p.zero_()
