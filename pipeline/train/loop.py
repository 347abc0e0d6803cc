"""What every training stage shares: its settings, resumable state, the step loop, logs.

A stage trains until it has done `steps` steps or spent `seconds` of wall time, whichever
comes first; the learning rate follows a warmup + cosine curve over the same progress, so
a time-capped run still ends at a low rate. Its state (model, optimiser, step, time spent)
is saved to `<state_dir>/state_<stage>.pt` every `save_every` steps and at the end; `resume`
continues from it, and a finished stage is not trained again.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class StageSettings:
    steps: int
    batch: int
    lr: float
    seconds: float = float("inf")  # wall-time cap for this stage
    warmup: int = 100
    log_every: int = 50
    save_every: int = 1000


class LossLog:
    """Appends one JSON line per logged step to `<out>/losses.jsonl` and echoes it."""

    def __init__(self, out: Path, echo: bool = True) -> None:
        self.path = out / "losses.jsonl"
        self.echo = echo

    def write(self, stage: str, step: int, values: dict[str, float], **extra) -> None:
        rec = {"stage": stage, "step": step, **{k: round(v, 6) for k, v in values.items()}}
        rec.update(extra)
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.echo:
            print(json.dumps(rec), flush=True)


def lr_at(progress: float, step: int, s: StageSettings) -> float:
    warm = min(1.0, (step + 1) / max(1, s.warmup))
    return s.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_stage(
    name: str,
    model: nn.Module,
    step_fn: Callable[[int], tuple[torch.Tensor, dict[str, float]]],
    s: StageSettings,
    state_dir: Path,
    log: LossLog,
    resume: bool,
) -> dict:
    """Run `step_fn(step) -> (loss, parts)` with AdamW until done; returns the final state.

    `model` holds every trained parameter (wrap several models in an nn.ModuleDict).
    """
    params = list(model.parameters())
    # fused: one kernel per step instead of several per tensor (small models are launch-bound)
    fused = all(p.is_cuda for p in params)
    opt = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.99), weight_decay=0.01, fused=fused)
    state_path = state_dir / f"state_{name}.pt"
    step, spent = 0, 0.0
    if resume and state_path.is_file():
        st = torch.load(state_path, map_location="cpu", weights_only=True)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, spent = int(st["step"]), float(st["seconds"])
        print(f"[{name}] resumed at step {step} ({spent:.0f} s spent)", flush=True)

    def save() -> None:
        torch.save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": spent},
            state_path,
        )

    model.train()
    t0 = time.perf_counter() - spent
    running: dict[str, float] = {}
    n_run = 0
    while step < s.steps and spent < s.seconds:
        progress = max(step / s.steps, spent / s.seconds)
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, step, s)
        loss, parts = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        spent = time.perf_counter() - t0
        logged: dict[str, torch.Tensor | float] = {
            "loss": loss.detach(),
            **parts,
            "grad_norm": grad_norm,
        }
        for k, v in logged.items():
            running[k] = running.get(k, 0.0) + float(v)  # one sync per step: fine at this size
        n_run += 1
        if step % s.log_every == 0 or step == s.steps:
            avg = {k: v / n_run for k, v in running.items()}
            log.write(name, step, avg, lr=round(opt.param_groups[0]["lr"], 7), s=round(spent, 1))
            running, n_run = {}, 0
        if step % s.save_every == 0:
            save()
    if n_run:
        log.write(name, step, {k: v / n_run for k, v in running.items()}, s=round(spent, 1))
    save()
    model.eval()
    return {"step": step, "seconds": spent}
