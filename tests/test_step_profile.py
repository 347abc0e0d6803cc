"""`bench/step_profile.py`, the GPU profile that picks the next speed lever: its kernel
kinds and busy time, and a run of the script on a test-shape release (on the CPU it only
checks that it runs, so the GPU session that needs it does not find it broken)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from step_profile import busy_ms, kernel_report, kind_of  # noqa: E402


@pytest.mark.parametrize(
    "name, kind",
    [
        ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128", "gemm fp8"),
        ("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "conv"),
        ("triton_per_fused__to_copy_add_mul_native_layer_norm_0", "compiled (triton)"),
        ("void at::native::elementwise_kernel<128, 4, ...copy_kernel...>", "copy"),
        ("void at::native::reduce_kernel<512, 1, ...>", "other"),
    ],
)
def test_kernels_are_sorted_by_what_they_do(name, kind):
    assert kind_of(name) == kind


def test_the_gpu_is_busy_for_the_union_of_its_kernels_not_their_sum():
    # two streams' kernels overlapping for 2 us, then a gap, then one more (times in us)
    assert busy_ms([(0, 5), (3, 8), (20, 21)]) == pytest.approx(0.009)
    assert busy_ms([]) == 0.0


def test_kernel_time_counts_kernels_not_the_annotations_spanning_them():
    """An annotation's GPU-side span (inductor's record_function ranges) covers kernels
    already counted: counted too, the kinds added up to more than the GPU was busy."""
    from types import SimpleNamespace

    import torch

    cuda = torch.autograd.DeviceType.CUDA

    def event(name, start, us, annotation=False):
        span = SimpleNamespace(start=start)
        return SimpleNamespace(
            name=name, device_type=cuda, device_time=us, time_range=span,
            is_user_annotation=annotation, self_cpu_time_total=0,
        )  # fmt: skip

    events = [
        event("## Call CompiledFxGraph fabc ##", 0, 1000, annotation=True),
        event("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT", 0, 600),
        event("triton_poi_fused_add_0", 600, 300),
    ]
    report = kernel_report(SimpleNamespace(events=lambda: events), wall_s=0.001, steps=1, top=5)
    assert report["kernel_ms_per_step_by_kind"] == {"gemm": 0.6, "compiled (triton)": 0.3}
    assert report["gpu_busy_ms_per_step"] == pytest.approx(0.9)
    assert [k["name"] for k in report["largest_kernels"]][0].startswith("nvjet")


@pytest.mark.slow  # a test-shape release and a start-up of its engine, in a process
def test_the_profile_runs_on_a_test_shape_release(tmp_path):
    from pipeline.liveavatar.random_release import write

    weights, lora = write(tmp_path / "release", "test", seed=5)
    out = tmp_path / "profile.json"
    run = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "step_profile.py"), "--model", "liveavatar",
            "--weights", str(weights), "--lora", str(lora), "--device", "cpu",
            "--set", "video.width=64", "--set", "video.height=64",
            "--warm-steps", "2", "--steps", "1", "--ops", "--json", str(out),
        ],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-1500:]
    report = json.loads(out.read_text())
    assert report["meta"]["frames"] == 12  # one block of LiveAvatar's
    assert report["wall_ms_per_step"] > 0 and report["largest_kernels"]
    assert sum(report["kernel_ms_per_step_by_kind"].values()) > 0
    # --ops: the operators by input shapes, the largest first
    ops = report["largest_ops"]
    assert ops and any(o["op"].startswith("aten::") for o in ops)
    assert all(o["calls_per_step"] > 0 for o in ops)
    assert [o["ms_per_step"] for o in ops] == sorted((o["ms_per_step"] for o in ops), reverse=True)
    assert any(o["input_shapes"] != "[]" for o in ops)
