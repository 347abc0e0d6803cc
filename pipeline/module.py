"""Module layer: one model plus its checkpoint, dtype and placement.

A checkpoint is a safetensors file per model. Loading is strict: every key the model
expects must be there with the same shape, and nothing else may be; otherwise
`CheckpointError` lists what is missing, unexpected or mis-shaped. Weights for a whole stack
live in one folder as `<name>.safetensors` (`vae`, `audio`, `a2v`, `sr`); `package:NAME`
points at a folder shipped inside the `pipeline` package (`pipeline/assets/weights/NAME`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Generic, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from pipeline.errors import CheckpointError, FacecastError

PACKAGE_WEIGHTS = Path(__file__).resolve().parent / "assets" / "weights"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> str:
    """`auto` → cuda when a GPU is there, else cpu; `cuda` without a GPU is a user error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise FacecastError("--device cuda was requested but no CUDA GPU is available")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_weights_dir(spec: str) -> Path:
    if spec.startswith("package:"):
        path = PACKAGE_WEIGHTS / spec.removeprefix("package:")
    else:
        path = Path(spec).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"weights folder not found: {path} (from {spec!r})")
    return path


def save_checkpoint(model: nn.Module, path: str | Path) -> None:
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))


def load_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Strictly load a safetensors file into `model` (keys and shapes must match exactly)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is not a readable safetensors file: {exc}"
        ) from None
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mis_shaped = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(state))
        if state[k].shape != expected[k].shape
    ]
    if missing or unexpected or mis_shaped:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[:3]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})")
        if mis_shaped:
            parts.append(f"{len(mis_shaped)} with other shapes (e.g. {mis_shaped[:2]})")
        raise CheckpointError(
            f"checkpoint {path} does not match the model: "
            + "; ".join(parts)
            + ". Check that the config matches the one the checkpoint was trained with."
        )
    model.load_state_dict(state, strict=True)


def build_seeded(factory, seed: int, device: torch.device | str = "cpu") -> nn.Module:
    """Construct a model with a deterministic random init that leaves the global RNG alone."""
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        return factory()


M = TypeVar("M", bound=nn.Module)


class Module(Generic[M]):
    """A named model with its weights source, dtype and device. Stages call `.model`
    (typed: a stage declares `Module[VAE]` and gets a `VAE`)."""

    def __init__(self, name: str, model: M, dtype: torch.dtype, device: torch.device):
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.dtype = dtype
        self.device = device

    def load(self, weights_dir: Path | None) -> Module[M]:
        """Load `<weights_dir>/<name>.safetensors`; with no folder, keep the seeded init."""
        if weights_dir is not None:
            load_checkpoint(self.model, weights_dir / f"{self.name}.safetensors")
        return self

    def place(self) -> Module[M]:
        self.model.to(device=self.device, dtype=self.dtype)
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())
