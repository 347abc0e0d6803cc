"""The compiled forms that `pipeline.precision` and the Wan layers choose for the GPU take
fewer instructions an element than torch's own lowering, and RoPE fuses into one pass:
`bench/kernel_instructions.py` counts them from Inductor's Triton code, compiled for Hopper
on this CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# at most this share of the instructions that torch's lowering takes
SHARES = {
    "GELU + quantisation": 0.7,
    "LayerNorm + modulation + quantisation": 0.7,
    "norm + SiLU": 0.8,
    "quantisation alone": 0.6,
}


@pytest.mark.slow  # compiles every form for Hopper in a process of its own (~35 s on 2 cores)
def test_the_compiled_forms_take_fewer_instructions(tmp_path):
    pytest.importorskip("triton")
    # its own interpreter: a test of the interpreted frame-attention kernel may have set
    # TRITON_INTERPRET in this one, and interpreted kernels cannot be compiled
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "counts.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernel_instructions.py"), "--json", str(out)],
        check=True,
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    rows = json.loads(out.read_text())["rows"]
    count = {(r["shape"], r["case"].split(" (")[0]): r["instructions_per_element"] for r in rows}
    shapes = {r["shape"] for r in rows}
    checked = 0
    for shape in shapes:
        for kind, share in SHARES.items():
            before, now = count.get((shape, f"{kind}, before")), count.get((shape, f"{kind}, now"))
            if before is None:
                continue
            assert now is not None and now <= share * before, (shape, kind, before, now)
            checked += 1
    assert checked == 9  # two FFNs, two LayerNorms, two quantisations, three decoder levels
    # a query's norm + RoPE: one pass now, where the stacked pairs took a float32 buffer and
    # a pass to narrow it (its bytes, not its instructions, were its cost)
    kernels = {(r["shape"], r["case"].split(" (")[0]): r["kernels"] for r in rows}
    ropes = [shape for shape in shapes if (shape, "norm + RoPE, now") in kernels]
    assert len(ropes) == 2, shapes  # FlashHead Pro's, LiveAvatar's
    moved = {(r["shape"], r["case"].split(" (")[0]): r["bytes_per_element"] for r in rows}
    for shape in ropes:
        assert kernels[(shape, "norm + RoPE, now")] == 1, shape
        assert kernels[(shape, "norm + RoPE, before")] >= 2, shape
        before, now = moved[(shape, "norm + RoPE, before")], moved[(shape, "norm + RoPE, now")]
        assert now <= 0.5 * before, (shape, before, now)  # Inductor's estimate: ~14 against ~6
