"""Instructions an element of Inductor's GPU kernels, counted on a machine with no GPU.

An elementwise pass on the H200 is bound either by its bytes or by the instructions each
element takes; a profile only says it is slow. Inductor lowers an op to the same Triton code
for every device Triton serves, so with `cpu_backend = "triton"` it writes, on a CPU, the
kernels it would write for the GPU. This script captures those kernels for one function,
compiles each for Hopper (sm_90) with the ptxas that Triton ships, and counts the SASS
instructions and special-function (MUFU) instructions an element takes. Beside them, for
the case's shape: the time the H200 needs to issue those instructions at its full rate and
the time it needs to move the bytes, whichever is larger bounds the kernel. Nothing is run.

The cases, each as it compiled before 2026-12-04 and as it compiles now, at the shapes of
FlashHead Pro's and LiveAvatar's blocks and of the Wan decoder's three upper levels: a block's
LayerNorm + modulation + the FP8 quantisation after it (torch's LayerNorm, then
`pipeline.models.layers.layer_norm`); an FFN's tanh-GELU + quantisation (torch's GELU and a
division and clamp, then `pipeline.precision.TanhGelu`'s logistic form and
`scaled_e4m3_on_gpu`); the quantisation alone; the decoder's norm + SiLU
(`vae_decode.norm_silu_after`); a self-attention's query RMS norm + RoPE (the pairs stacked,
then `pipeline.models.layers.apply_rope`'s swapped-pair form), whose cost was in the
kernels and bytes around it more than in instructions, so every kernel it writes is counted.
Run from the repo root:

    python bench/kernel_instructions.py --json bench/results/kernel_instructions.json

A pointwise kernel is counted at Inductor's usual launch for a large one (1,024 elements a
program, 4 warps); a persistent reduction at the fewest instructions an element among the
launches Inductor tries; a looped reduction with its block as wide as its row, so that each
loop runs once and the code's count is what runs. Inductor's internals are patched to get
the code out, so a newer torch may need this script mended.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.models.layers import apply_rope, layer_norm  # noqa: E402
from pipeline.models.wan.layers import RMSNorm  # noqa: E402
from pipeline.models.wan.vae_decode import norm_silu_after  # noqa: E402
from pipeline.precision import (  # noqa: E402
    E4M3_MAX,
    logistic_tanh_gelu,
    scaled_e4m3_on_gpu,
)

POINTWISE_LAUNCH = (1024, 4)  # (XBLOCK, warps): Inductor's launch for a large pointwise kernel
# a persistent reduction's rows a program and warps: Inductor tries several and keeps the
# fastest; the count kept is the fewest instructions an element among these
REDUCTION_LAUNCHES = ((8, 4), (32, 8))
LOOPED_REDUCTION_WARPS = (8, 16)  # a looped reduction: one row a program
# The H200 (SXM): 132 SMs, 4 schedulers each issuing one 32-thread instruction a clock at
# up to 1.98 GHz; device copies measured at 4.18 TB/s (DESIGN.md, section 7)
H200_LANE_INSTRUCTIONS_PER_S = 132 * 4 * 32 * 1.98e9
H200_BYTES_PER_S = 4.18e12


def quantise_before(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """The quantisation as every compiled FP8 pass made it until 2026-12-04 (still the
    eager one): a division and a clamp before the conversion."""
    return (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def norm_silu_before(prev: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """The Wan decoder's norm + SiLU as it was compiled until 2026-12-04 (still the eager
    form): F.normalize's square root and division, torch's SiLU."""
    normed = F.normalize(x.float(), dim=1).to(x.dtype) * x.shape[1] ** 0.5 * gamma
    return torch.cat([prev, F.silu(normed)], dim=2)


def rope_before(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (tokens first) as it was written until 2026-12-05: the rotated halves stacked."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


@dataclass
class Case:
    shape: str
    name: str
    fn: Callable[..., torch.Tensor]
    inputs: Callable[[], tuple[torch.Tensor, ...]]  # small tensors of the real row width
    elements: int  # of one call at the real shape
    # moved to and from memory an element; None: Inductor's own estimate, over every kernel
    bytes_per_element: int | None
    every_kernel: bool = False  # count all the kernels Inductor writes, not its largest


def ffn_cases(shape: str, tokens: int, width: int) -> list[Case]:
    def inputs() -> tuple[torch.Tensor, ...]:
        # the descale (1,): a GPU buffer, as the layer's, not a host scalar
        return torch.randn(64, width, dtype=torch.bfloat16), torch.tensor([0.05])

    n = tokens * width
    return [  # bf16 in, e4m3 out
        Case(
            shape,
            "GELU + quantisation, before (torch's tanh-GELU, divide, clamp)",
            lambda h, d: quantise_before(F.gelu(h, approximate="tanh"), d),
            inputs,
            n,
            3,
        ),
        Case(
            shape,
            "GELU + quantisation, now (TanhGelu, scaled_e4m3 on a GPU)",
            lambda h, d: scaled_e4m3_on_gpu(logistic_tanh_gelu(h), d),
            inputs,
            n,
            3,
        ),
        Case(shape, "quantisation alone, before", quantise_before, inputs, n, 3),
        Case(shape, "quantisation alone, now", scaled_e4m3_on_gpu, inputs, n, 3),
    ]


def decode_norm_cases(shape: str, channels: int, side: int) -> list[Case]:
    def inputs() -> tuple[torch.Tensor, ...]:
        x = torch.randn(1, channels, 4, 8, 8, dtype=torch.bfloat16)
        prev = torch.randn(1, channels, 2, 8, 8, dtype=torch.bfloat16)
        gamma = torch.randn(channels, 1, 1, 1, dtype=torch.bfloat16)
        cl = torch.channels_last_3d
        return prev.contiguous(memory_format=cl), x.contiguous(memory_format=cl), gamma

    n = channels * side * side  # a video frame's
    return [  # bf16 in, bf16 out
        Case(
            shape, "norm + SiLU, before (F.normalize, torch's SiLU)", norm_silu_before, inputs, n, 4
        ),
        Case(shape, "norm + SiLU, now (rsqrt, logistic SiLU)", norm_silu_after, inputs, n, 4),
    ]


def layer_norm_cases(shape: str, tokens: int, dim: int) -> list[Case]:
    """A Wan block's LayerNorm, modulation and the FP8 quantisation of the linear after it
    (one kernel on the GPU: the profile's `..._native_layer_norm_...` Triton kernels)."""

    def inputs() -> tuple[torch.Tensor, ...]:
        x = torch.randn(1, 64, dim, dtype=torch.bfloat16)
        scale, shift = (torch.randn(1, 1, dim, dtype=torch.bfloat16) for _ in range(2))
        return x, scale, shift, torch.tensor([0.05])  # (1,): a GPU buffer, not a host scalar

    def before(x, scale, shift, descale):
        y = F.layer_norm(x, (dim,), eps=1e-6) * (1 + scale) + shift
        return scaled_e4m3_on_gpu(y.reshape(-1, dim), descale)

    def now(x, scale, shift, descale):
        y = layer_norm(x, 1e-6) * (1 + scale) + shift
        return scaled_e4m3_on_gpu(y.reshape(-1, dim), descale)

    n = tokens * dim
    return [  # bf16 in, e4m3 out
        Case(
            shape, "LayerNorm + modulation + quantisation, before (Welford)", before, inputs, n, 3
        ),
        Case(shape, "LayerNorm + modulation + quantisation, now (two passes)", now, inputs, n, 3),
    ]


def rope_cases(shape: str, tokens: int, dim: int, heads: int) -> list[Case]:
    """A self-attention's query RMS norm (over the whole width) + RoPE, q a third of the
    qkv projection's output, as FlashHead's and LiveAvatar's blocks compute it before
    attention. Before: a sum-of-squares pass, a pass writing the rotated pairs into a
    float32 buffer, a pass narrowing it to bf16 (2 + 2 + 4 + 4 + 2 bytes an element). Now
    one pass (2 in, 2 out). Their bytes are Inductor's estimate, summed over the kernels."""
    norm = RMSNorm(dim, 1e-6).to(torch.bfloat16)

    def inputs() -> tuple[torch.Tensor, ...]:
        angles = torch.randn(64, dim // heads // 2)
        return torch.randn(1, 64, 3 * dim, dtype=torch.bfloat16), angles.cos(), angles.sin()

    def query(qkv: torch.Tensor) -> torch.Tensor:
        q = qkv.chunk(3, dim=-1)[0]
        return norm(q).view(*q.shape[:2], heads, -1)

    n = tokens * dim
    return [  # bf16 in, bf16 out
        Case(
            shape,
            "norm + RoPE, before (the rotated halves stacked)",
            lambda qkv, cos, sin: rope_before(query(qkv), cos, sin),
            inputs,
            n,
            None,
            every_kernel=True,
        ),
        Case(
            shape,
            "norm + RoPE, now (apply_rope: x cos + swapped x (-sin, sin))",
            lambda qkv, cos, sin: apply_rope(query(qkv), cos, sin, tokens_first=True),
            inputs,
            n,
            None,
            every_kernel=True,
        ),
    ]


CASES = [
    *layer_norm_cases("flashhead-pro block, a call", 9216, 1536),
    *layer_norm_cases("liveavatar layer, a call", 3168, 5120),
    *ffn_cases("flashhead-pro ffn, a call", 9216, 8960),
    *ffn_cases("liveavatar ffn, a call", 3168, 13824),
    *decode_norm_cases("wan decode 96 ch 512x512, a frame", 96, 512),
    *decode_norm_cases("wan decode 192 ch 256x256, a frame", 192, 256),
    *decode_norm_cases("wan decode 384 ch 128x128, a frame", 384, 128),
    *rope_cases("flashhead-pro self-attention q, a call", 9216, 1536, 12),
    *rope_cases("liveavatar self-attention q, a call", 3168, 5120, 40),
]


def inductor_triton_sources(fn: Callable, *args: torch.Tensor) -> list[str]:
    """The Triton kernels Inductor writes for `fn(*args)`, captured as it writes them (the
    compile then fails for want of a Triton CPU backend, which is expected)."""
    import torch._inductor.codegen.triton as codegen
    import torch._inductor.config as inductor_config
    import torch.utils._triton as triton_utils

    sources: list[str] = []
    write = codegen.TritonKernel.codegen_kernel

    def capture(self, *a, **k):
        src = write(self, *a, **k)
        sources.append(src)
        return src

    saved_hash = triton_utils.triton_hash_with_backend
    triton_utils.triton_hash_with_backend = lambda: "no-driver"  # asks for a driver, none here
    codegen.TritonKernel.codegen_kernel = capture
    # every setting put back after, so that a process's other compiles are not touched
    # `benchmark_kernel`: each kernel's source then carries Inductor's estimate of the bytes
    # it moves (`kernel_num_gb`, each buffer it reads or writes counted once)
    settings = {
        "cpu_backend": "triton",
        "compile_threads": 1,
        "force_disable_caches": True,
        "benchmark_kernel": True,
    }
    try:
        torch._dynamo.reset()
        with inductor_config.patch(settings), torch.inference_mode():  # as the engines run
            torch.compile(fn)(*args)
    except Exception:  # noqa: BLE001 - the compile cannot finish here; the sources are made
        pass
    finally:
        torch._dynamo.reset()
        codegen.TritonKernel.codegen_kernel = write
        triton_utils.triton_hash_with_backend = saved_hash
    return sources


def sass_of(source: str, launch: tuple[int, int, int | None], workdir: Path) -> str:
    """One captured kernel compiled for sm_90 at `launch` (XBLOCK, warps, and R0_BLOCK where
    the kernel takes it): its SASS."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    match = re.search(r"'signature': (\{[^}]*\})", source)
    if match is None:
        raise ValueError("no signature in the captured kernel")
    signature = ast.literal_eval(match.group(1))
    # every pointer 16-byte aligned, as the GPU's caching allocator gives them (a CPU
    # tensor's may not be, and unaligned accesses are not vectorised)
    attrs = {
        (i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t[0] == "*"
    }
    body = source[source.index("@triton.jit") :].replace("Placeholder.KERNEL_NAME", "kernel")
    header = (
        "import triton\nimport triton.language as tl\n"
        "from triton.language import math as tl_math\n"
        "from triton.language.extra.cuda import libdevice\n"
        "from torch._inductor.runtime import triton_helpers\n\n"
    )
    xblock, warps, r0_block = launch
    path = workdir / f"kernel_{abs(hash(source))}_{xblock}_{warps}_{r0_block}.py"
    constants = {"XBLOCK": xblock} if r0_block is None else {"XBLOCK": xblock, "R0_BLOCK": r0_block}
    path.write_text(header + body)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    compiled = triton.compile(
        ASTSource(fn=module.kernel, signature=signature, constexprs=constants, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps},
    )
    cubin = path.with_suffix(".cubin")
    cubin.write_bytes(compiled.asm["cubin"])
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    return subprocess.run(
        [str(nvdisasm), "-c", str(cubin)], check=True, capture_output=True, text=True
    ).stdout


def instruction_counts(sass: str) -> tuple[int, int]:
    """(instructions, MUFU instructions) of a kernel's SASS, NOPs left out."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    ops = [ln for ln in lines if "NOP" not in ln]
    return len(ops), sum("MUFU" in ln for ln in ops)


def per_element(source: str, workdir: Path) -> tuple[float, float]:
    """(instructions, MUFU instructions) an element a kernel writes: a pointwise kernel's
    program makes XBLOCK elements, a persistent reduction's XBLOCK rows of r0_numel (its
    lanes past r0_numel, masked, count against the useful ones). A looped reduction is
    counted with R0_BLOCK the row's next power of two, so that each loop runs once and the
    code's count is what runs (Inductor may take a smaller block and loop)."""
    row = re.search(r"r0_numel = (\d+)", source)
    width = int(row.group(1)) if row is not None else 1
    if "@triton_heuristics.pointwise" in source:
        launches, width = [(*POINTWISE_LAUNCH, None)], 1
    elif "@triton_heuristics.persistent_reduction" in source and row is not None:
        launches = [(x, w, None) for x, w in REDUCTION_LAUNCHES]
    elif "@triton_heuristics.reduction" in source and row is not None:
        block = 1 << (width - 1).bit_length()
        launches = [(1, warps, block) for warps in LOOPED_REDUCTION_WARPS]
    else:
        raise ValueError("only pointwise kernels and reductions are counted")
    counts = []
    for xblock, warps, r0_block in launches:
        sass = sass_of(source, (xblock, warps, r0_block), workdir)
        instructions, mufu = instruction_counts(sass)
        threads, elements = 32 * warps, xblock * width
        counts.append((instructions * threads / elements, mufu * threads / elements))
    return min(counts)


def elements_of(source: str) -> int:
    """The elements a captured kernel runs over: its rows times their width for a
    reduction, else its elements (what `per_element` counts per)."""
    sizes = [re.search(rf"{name} = (\d+)", source) for name in ("xnumel", "r0_numel")]
    x, r = (int(m.group(1)) if m is not None else 1 for m in sizes)
    return x if "@triton_heuristics.pointwise" in source else x * r


def estimated_bytes(source: str) -> float:
    """Inductor's estimate of the bytes a captured kernel moves (`kernel_num_gb`)."""
    match = re.search(r"'kernel_num_gb': ([0-9.e+-]+)", source)
    if match is None:
        raise ValueError("the captured kernel carries no byte estimate")
    return float(match.group(1)) * 1e9


def measure_case(case: Case, workdir: Path) -> dict:
    """The case's main kernel (its largest, where Inductor writes several: the decoder's
    look-back copy is a small kernel beside the norm's), counted."""
    args = case.inputs()
    sources = inductor_triton_sources(case.fn, *args)
    if not sources:
        raise RuntimeError(f"{case.name}: Inductor wrote no kernel")
    with torch.inference_mode():
        written = case.fn(*args).numel()
    if case.every_kernel:  # each kernel's count over its elements, per element of the output
        counts = [(per_element(src, workdir), elements_of(src)) for src in sources]
        instructions = sum(i * n for (i, _), n in counts) / written
        mufu = sum(m * n for (_, m), n in counts) / written
        moved = sum(estimated_bytes(src) for src in sources) / written
    else:
        main_kernel = max(sources, key=len)
        instructions, mufu = per_element(main_kernel, workdir)
        moved = estimated_bytes(main_kernel) / written
    bytes_per_element = case.bytes_per_element if case.bytes_per_element is not None else moved
    issue_us = case.elements * instructions / H200_LANE_INSTRUCTIONS_PER_S * 1e6
    bytes_us = case.elements * bytes_per_element / H200_BYTES_PER_S * 1e6
    return {
        "shape": case.shape,
        "case": case.name,
        "elements": case.elements,
        "kernels": len(sources),
        "instructions_per_element": round(instructions, 2),
        "bytes_per_element": round(bytes_per_element, 2),
        "inductor_bytes_per_element": round(moved, 2),
        "mufu_per_element": round(mufu, 2),
        "issue_us_h200": round(issue_us, 1),
        "bytes_us_h200": round(bytes_us, 1),
        "bound": "instructions" if issue_us > bytes_us else "bytes",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            row = measure_case(case, Path(tmp))
            rows.append(row)
            print(
                f"{case.shape:36s} {case.name:62s} {row['instructions_per_element']:5.1f} "
                f"instr/elem ({row['mufu_per_element']:.1f} MUFU)  issue "
                f"{row['issue_us_h200']:6.1f} us  bytes {row['bytes_us_h200']:6.1f} us  "
                f"-> {row['bound']}"
            )
    if args.json:
        meta = {
            "torch": torch.__version__,
            "target": "sm_90",
            "pointwise_launch": POINTWISE_LAUNCH,
            "reduction_launches": REDUCTION_LAUNCHES,
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
