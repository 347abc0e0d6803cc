"""Reading the checkpoints that real models publish, as users download them.

The project's own stacks keep one safetensors file per model (`pipeline.module`). Published
models come in other layouts: a diffusers folder (`config.json` beside one
`diffusion_pytorch_model.safetensors`, or shards named by a `….safetensors.index.json`),
a plain `.pth` state dict. Here they are read into a name → tensor dict, and a model's
mapping table (its `load_weights`) moves them onto the module, strictly: every problem is
a `CheckpointError` of one line that names the file and what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from pipeline.errors import CheckpointError

SAFETENSORS_NAME = "diffusion_pytorch_model.safetensors"


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def read_safetensors(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{path}: not a readable safetensors file, truncated or damaged ({reason})"
        ) from None


def read_diffusers_weights(folder: Path, name: str = SAFETENSORS_NAME) -> dict[str, Tensor]:
    """The weights of a diffusers model folder: one safetensors file, or the shards its
    index lists (each shard must hold exactly the keys the index gives it)."""
    single = folder / name
    index = folder / f"{name}.index.json"
    if single.is_file():
        return read_safetensors(single)
    if not index.is_file():
        raise CheckpointError(f"{folder}: neither {name} nor {index.name} found")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: no 'weight_map' of parameter name → shard file")
    state: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        tensors = read_safetensors(folder / shard)
        listed = {k for k, v in weight_map.items() if v == shard}
        if set(tensors) != listed:
            extra = sorted(set(tensors) - listed) or sorted(listed - set(tensors))
            raise CheckpointError(
                f"{folder / shard}: holds other keys than {index.name} lists (e.g. {extra[0]!r})"
            )
        state.update(tensors)
    return state


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A `.pth` file holding a state dict (tensors only: nothing is unpickled but tensors)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a damaged zip or pickle
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{path}: not a readable PyTorch state dict, truncated or damaged ({reason[:120]}): "
            "download it again"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(
            f"{path}: not a plain state dict of tensors (found {type(state).__name__})"
        )
    return state


def load_mapped(
    model: nn.Module,
    state: dict[str, Tensor],
    source: Path,
    fused: dict[str, list[str]] | None = None,
    ignored: Iterable[str] = (),
) -> None:
    """Load `state` (published names) into `model` strictly.

    `fused` maps a module parameter to the published tensors concatenated (dim 0) into it,
    by suffix: {"self_attn.qkv.weight": ["self_attn.q.weight", "self_attn.k.weight", …]}.
    Every other parameter takes the published tensor of its own name. Published names
    starting with an `ignored` prefix are weights the release carries but the model never
    reads. Anything else left over, missing, mis-shaped or not floating point is an error
    naming `source` and the key.
    """
    fused = fused or {}
    ignored = tuple(ignored)
    used: set[str] = set()
    loaded: dict[str, Tensor] = {}
    for name, param in model.state_dict().items():
        parts = next(
            (
                [name[: -len(suffix)] + p for p in srcs]
                for suffix, srcs in fused.items()
                if name.endswith(suffix)
            ),
            [name],
        )
        for p in parts:
            if p not in state:
                raise CheckpointError(f"{source}: missing key {p!r}")
            if not state[p].is_floating_point():
                raise CheckpointError(f"{source}: {p!r} is {state[p].dtype}, not floating point")
        tensor = torch.cat([state[p] for p in parts]) if len(parts) > 1 else state[parts[0]]
        if tuple(tensor.shape) != tuple(param.shape):
            shapes = [tuple(state[p].shape) for p in parts]
            raise CheckpointError(
                f"{source}: {parts[0]!r} has shape {shapes[0] if len(shapes) == 1 else shapes}, "
                f"the model expects {tuple(param.shape)}" + (" (fused)" if len(parts) > 1 else "")
            )
        used.update(parts)
        loaded[name] = tensor
    unknown = sorted(k for k in state if k not in used and not k.startswith(ignored))
    if unknown:
        raise CheckpointError(
            f"{source}: key {unknown[0]!r} does not map onto the model"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
        )
    model.load_state_dict(loaded, strict=True, assign=False)


def write_sharded(
    state: dict[str, Tensor],
    folder: Path,
    max_shard_bytes: int,
    name: str = SAFETENSORS_NAME,
) -> list[Path]:
    """Write `state` as diffusers' `save_pretrained` shards it: `…-0000N-of-0000M.safetensors`
    files of at most `max_shard_bytes` each (a tensor larger than that gets a shard of its
    own), filled in key order, and `….safetensors.index.json` naming each key's shard. One
    shard is written under the plain `name`, with no index, as diffusers does too. The
    writer of random releases for tests and benchmarks; `read_diffusers_weights` reads it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    groups: list[list[str]] = [[]]
    filled = 0
    for key in sorted(state):
        size = state[key].numel() * state[key].element_size()
        if groups[-1] and filled + size > max_shard_bytes:
            groups.append([])
            filled = 0
        groups[-1].append(key)
        filled += size
    stem = name.removesuffix(".safetensors")
    names = (
        [name]
        if len(groups) == 1
        else [f"{stem}-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    for shard, keys in zip(names, groups, strict=True):
        save_file({k: state[k].contiguous() for k in keys}, str(folder / shard))
    if len(groups) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
            "weight_map": {
                k: shard for shard, keys in zip(names, groups, strict=True) for k in keys
            },
        }
        (folder / f"{name}.index.json").write_text(json.dumps(index, indent=2))
    return [folder / n for n in names]
