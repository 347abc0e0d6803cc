"""Where an engine's weights live: planned in one function, applied in another.

`plan_placement` decides, from the config and the GPU memory there is, whether the DiTs stay
resident, stream in from pinned host memory (`pipeline.offload`), or, for random-weight
configs too large to build whole, are built block by block. `Engine.load` builds what the
plan says, and attaches the offloader to the session's stage boundaries from outside the
chunk loop (`pipeline.diffusion.engine.apply_placement`, the way torchtitan applies
`parallelize_*` from outside the model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.config import FacecastConfig
from pipeline.diffusion.build import SEED_OFFSETS, build_models, module_dtype
from pipeline.module import DTYPES, Module
from pipeline.offload import OffloadConfig, OffloadManager, materialize_blockwise

# Offload when the DiTs' weights would take more than this share of the GPU memory there is.
OFFLOAD_ABOVE_SHARE = 0.7
# Build random weights block by block when two copies (the fp32 init and its cast) would
# take more than this share: the whole fp32 model then never exists.
BLOCKWISE_ABOVE_SHARE = 0.5
# Under a memory cap, offloaded blocks may stay resident in this share of it (one DiT, if
# it fits); the rest is activations, masks and the small models.
RESIDENT_SHARE_UNDER_CAP = 0.6


@dataclass
class Placement:
    offload: OffloadConfig | None = None  # None: every weight resident
    blockwise: bool = False  # random-weight DiTs built on the device one block at a time


def plan_placement(
    cfg: FacecastConfig,
    device: torch.device | str,
    offload: OffloadConfig | bool | None = None,
    memory_cap_bytes: int | None = None,
) -> Placement:
    """offload: an OffloadConfig or True streams the DiT blocks in; False never does; None
    decides from the GPU memory there is (or the cap). On the CPU nothing is planned."""
    room = gpu_room(torch.device(device), memory_cap_bytes)
    bits = torch.finfo(DTYPES[cfg.runtime.dtype]).bits
    dit_bytes = dit_weight_bytes(cfg, bits // 8) if room else 0
    if offload is None:
        offload = bool(room) and dit_bytes > OFFLOAD_ABOVE_SHARE * (room or 0)
    offload_cfg = OffloadConfig() if offload is True else (offload or None)
    if offload_cfg and offload_cfg.budget_gb is None and room and memory_cap_bytes:
        offload_cfg.budget_gb = RESIDENT_SHARE_UNDER_CAP * room / 1e9
    blockwise = bool(room) and not cfg.runtime.weights
    blockwise = blockwise and 2 * dit_bytes > BLOCKWISE_ABOVE_SHARE * (room or 0)
    return Placement(offload=offload_cfg, blockwise=blockwise)


def build_blockwise(
    cfg: FacecastConfig, device: torch.device, placement: Placement
) -> tuple[dict[str, Module], OffloadManager | None]:
    """The models of a random-weight config too large to build whole: the small ones as
    usual, the DiTs on the meta device, then materialised block by block (into the
    offloader's host buffers when the plan offloads)."""
    models = build_models(cfg, "meta")
    models.update(build_models(cfg, device, only=("vae", "audio")))
    manager = OffloadManager(device, placement.offload) if placement.offload else None
    modules = {}
    for name, model in models.items():
        module = Module(name, model, module_dtype(cfg, name), device)
        if name in ("a2v", "sr"):
            seed = cfg.runtime.init_seed + SEED_OFFSETS[name]
            materialize_blockwise(model, device, module.dtype, seed, manager, name)
        else:
            module.place()
        modules[name] = module
    return modules, manager


def gpu_room(device: torch.device, cap: int | None) -> int | None:
    """Bytes of GPU memory the engine may use on a CUDA device; None on the CPU."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return min(free, cap) if cap else free


def dit_weight_bytes(cfg: FacecastConfig, bytes_per_param: int = 2) -> int:
    """Parameter bytes of the two DiTs of a config, counted on the meta device (no memory)."""
    models = build_models(cfg, "meta", only=("a2v", "sr"))
    return bytes_per_param * sum(p.numel() for m in models.values() for p in m.parameters())
