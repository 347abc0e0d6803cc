"""LoRA files in PEFT's layout, merged into a model's published weights before it loads.

A LoRA fine-tune (LiveAvatar's `liveavatar.safetensors` over Wan2.2-S2V-14B) publishes, for
each adapted linear layer `X` (weight `X.weight`, shape out x in), two matrices:

    [base_model.model.]X.lora_A[.default].weight   A: rank x in
    [base_model.model.]X.lora_B[.default].weight   B: out x rank

PEFT writes the `base_model.model.` prefix and the adapter name `.default` when a whole
`PeftModel` is saved, and leaves both out in `save_pretrained`; either reads here. The
merged weight is PEFT's `merge_and_unload`: W + (alpha / rank) · B @ A, here computed in
float32 and cast back once. The rank comes from the tensors; alpha from the caller (the
authors' training config: rank 128, alpha 64) or the `adapter_config.json` beside the file.

A file may also carry whole weights (no `lora_` in the name): the authors load it into the
PEFT model with `strict=False`, so such a tensor replaces the base weight of the same
name (`X.base_layer.weight` is PEFT's name for `X.weight`) before the merge, and one that
names no weight of the model is dropped, as `strict=False` drops it; `merge_lora` logs it.

Every problem (an A without its B, ranks that disagree, a LoRA for a weight the model does
not have, a shape that does not fit) is a `CheckpointError` of one line naming the file.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from pipeline.checkpoints import read_json, read_safetensors
from pipeline.errors import CheckpointError

log = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class LoraFile:
    """A LoRA file read into published names: `pairs` maps a base weight's name
    (`blocks.0.self_attn.q.weight`) to its (A, B); `full` holds whole weights by name."""

    path: Path
    pairs: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)
    full: dict[str, Tensor] = field(default_factory=dict)
    alpha: float | None = None  # from adapter_config.json, where the file has one
    rslora: bool = False  # PEFT's use_rslora: scale alpha / sqrt(rank)

    @property
    def rank(self) -> int:
        """The rank every pair has (LiveAvatar's: 128); 0 where they differ."""
        ranks = {a.shape[0] for a, _ in self.pairs.values()}
        return ranks.pop() if len(ranks) == 1 else 0

    def scale(self, alpha: float | None, rank: int) -> float:
        """PEFT's `scaling`: alpha / rank (alpha / sqrt(rank) with rsLoRA)."""
        a = self.alpha if alpha is None else alpha
        if a is None:
            raise CheckpointError(
                f"{self.path}: no LoRA alpha: pass it (LiveAvatar's is 64) or put "
                f"{ADAPTER_CONFIG} with 'lora_alpha' beside the file"
            )
        return a / (math.sqrt(rank) if self.rslora else rank)


def split_key(key: str) -> tuple[str, str | None]:
    """(published weight name, "A" | "B" | None) of one key of a LoRA file.

    `base_model.model.blocks.0.ffn.0.lora_B.default.weight` → ("blocks.0.ffn.0.weight", "B");
    `blocks.0.ffn.0.base_layer.weight` → ("blocks.0.ffn.0.weight", None)."""
    name = key.removeprefix(PEFT_PREFIX)
    for part, which in ((".lora_A.", "A"), (".lora_B.", "B")):
        module, sep, rest = name.partition(part)
        if sep:
            if rest not in ("weight", "default.weight"):
                raise ValueError(f"LoRA key {key!r} is not '<module>{part}[default.]weight'")
            return f"{module}.weight", which
    if "lora_" in name:  # embeddings, DoRA magnitudes, other adapters: not PEFT's Linear LoRA
        raise ValueError(f"key {key!r} is a kind of LoRA tensor this reader does not merge")
    return name.replace(".base_layer.", "."), None


def pair_keys(
    shapes: dict[str, tuple[int, ...]], path: Path
) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """The file's keys grouped: weight name → (A key, B key) and weight name → whole key,
    checked from the shapes alone (the preflight reads no tensor data)."""
    halves: dict[str, dict[str, str]] = {}
    full: dict[str, str] = {}
    for key in sorted(shapes):
        try:
            name, which = split_key(key)
        except ValueError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        if which is None:
            full[name] = key
            continue
        if len(shapes[key]) != 2:
            raise CheckpointError(f"{path}: {key!r} has shape {shapes[key]}, not a matrix")
        if which in halves.setdefault(name, {}):
            raise CheckpointError(f"{path}: two lora_{which} tensors for {name!r}")
        halves[name][which] = key
    pairs: dict[str, tuple[str, str]] = {}
    for name, h in halves.items():
        if set(h) != {"A", "B"}:
            has, lacks = ("A", "B") if "A" in h else ("B", "A")
            raise CheckpointError(f"{path}: {h[has]!r} has no lora_{lacks} beside it")
        rank_a, rank_b = shapes[h["A"]][0], shapes[h["B"]][1]
        if rank_a != rank_b:
            raise CheckpointError(
                f"{path}: {h['A']!r} has rank {rank_a} but {h['B']!r} has rank {rank_b}"
            )
        pairs[name] = (h["A"], h["B"])
    if not pairs:
        raise CheckpointError(f"{path}: no lora_A/lora_B pairs: not a PEFT LoRA file")
    return pairs, full


def lora_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every key's shape from the safetensors header (no tensor data read)."""
    from safetensors import safe_open

    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        with safe_open(str(path), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own and OS errors
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: truncated or damaged ({reason})") from None


def check_lora(path: Path) -> int:
    """Serve's preflight of a LoRA file: readable, its keys well formed and paired. The
    number of LoRA pairs."""
    pairs, _ = pair_keys(lora_shapes(path), path)
    read_adapter_config(path)
    return len(pairs)


def read_adapter_config(path: Path) -> tuple[float | None, bool]:
    """(alpha, rsLoRA) from an `adapter_config.json` beside the LoRA file, if there is one."""
    config = path.parent / ADAPTER_CONFIG
    if not config.is_file():
        return None, False
    raw = read_json(config)
    alpha = raw.get("lora_alpha")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise CheckpointError(f"{config}: 'lora_alpha' must be a positive number (got {alpha!r})")
    if raw.get("alpha_pattern") or raw.get("rank_pattern"):
        raise CheckpointError(
            f"{config}: per-layer 'alpha_pattern'/'rank_pattern' are not supported"
        )
    return float(alpha), bool(raw.get("use_rslora", False))


def read_lora(path: str | Path) -> LoraFile:
    """A PEFT-layout LoRA safetensors file, its keys checked and paired."""
    path = Path(path)
    tensors = read_safetensors(path)
    pairs, full = pair_keys({k: tuple(v.shape) for k, v in tensors.items()}, path)
    alpha, rslora = read_adapter_config(path)
    return LoraFile(
        path,
        pairs={name: (tensors[a], tensors[b]) for name, (a, b) in pairs.items()},
        full={name: tensors[key] for name, key in full.items()},
        alpha=alpha,
        rslora=rslora,
    )


def merge_lora(
    state: dict[str, Tensor], lora: LoraFile, alpha: float | None = None
) -> dict[str, Tensor]:
    """Merge `lora` into `state` (published names) in place and return it: whole weights
    first (as the authors' `load_state_dict` puts them in before `merge_and_unload`), then
    W += scale · B @ A for every pair, in float32, cast back to W's dtype once."""
    path = lora.path
    dropped = []
    for name, tensor in lora.full.items():
        if name not in state:
            dropped.append(name)
            continue
        if tensor.shape != state[name].shape:
            raise CheckpointError(
                f"{path}: {name!r} has shape {tuple(tensor.shape)}, "
                f"the base weight {tuple(state[name].shape)}"
            )
        state[name] = tensor.to(state[name].dtype)
    if dropped:
        log.warning(
            "%s: %d whole weight(s) name nothing in the model and are dropped, as the "
            "authors' strict=False load drops them (e.g. %r)",
            path,
            len(dropped),
            dropped[0],
        )
    for name, (down_RI, up_OR) in lora.pairs.items():
        if name not in state:
            raise CheckpointError(f"{path}: LoRA for {name!r}, which the model does not have")
        weight_OI = state[name]
        want = (up_OR.shape[0], down_RI.shape[1])
        if tuple(weight_OI.shape) != want:
            raise CheckpointError(
                f"{path}: LoRA for {name!r} makes shape {want}, "
                f"the base weight is {tuple(weight_OI.shape)}"
            )
        scale = lora.scale(alpha, down_RI.shape[0])
        # on the base weight's device: a state moved to the GPU first merges there (the 14B
        # model's 400 pairs are ~3 TFLOP, minutes on a CPU)
        dev, f32 = weight_OI.device, torch.float32
        delta_OI = (up_OR.to(dev, f32) @ down_RI.to(dev, f32)) * scale
        state[name] = (weight_OI.float() + delta_OI).to(weight_OI.dtype)
    return state


def random_lora(
    shapes: dict[str, tuple[int, ...]],
    rank: int,
    seed: int,
    std: float = 0.02,
    prefix: str = PEFT_PREFIX,
    adapter: str = ".default",
) -> dict[str, Tensor]:
    """A LoRA state dict in the published layout for the weights named in `shapes`
    (`blocks.0.self_attn.q.weight` → out x in), random A and B (B is zero after PEFT's
    initialisation; a trained B is not, and a zero one would hide a merge that does
    nothing). The same values for a seed on every machine (drawn on the CPU in name order)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for name in sorted(shapes):
        o, i = shapes[name]
        module = prefix + name.removesuffix(".weight")
        out[f"{module}.lora_A{adapter}.weight"] = torch.randn(rank, i, generator=gen) / math.sqrt(i)
        out[f"{module}.lora_B{adapter}.weight"] = std * torch.randn(o, rank, generator=gen)
    return out
