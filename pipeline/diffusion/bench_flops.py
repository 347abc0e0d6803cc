"""FLOPs of the diffusion stack's stage calls, counted, and what they imply against the H200's
measured bf16 peak: achieved TFLOP/s, the compute floor of a chunk, the fps ceiling."""

from __future__ import annotations

from unittest import mock

from pipeline.bench import force_eager

H200_BF16_PEAK = 784e12  # FLOP/s, measured (DESIGN.md §7)
H200_HBM_BYTES = 4.18e12  # B/s device copy, measured
H200_H2D_PINNED = 55.5e9  # B/s pinned host → device, measured


def count_call_flops(fn, args, engine) -> dict[str, int]:
    """FLOPs of one stage call: matmuls/convs counted by FlopCounterMode, attention useful
    FLOPs from its shapes and mask (FlopCounterMode would count masked attention as dense and
    cannot see Triton kernels). Attention itself is stubbed out while counting: its count
    does not depend on values, and an eager FlexAttention would materialise the scores."""
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.kernels.frame_mask import FrameWindowSpec, frame_window_flops
    from pipeline.models.attention import Attention

    attn_flops = [0]

    def counted_attention(self, q, k, v, window=None):
        B, N, L, H = q.shape
        spec = (
            None
            if window is None
            else FrameWindowSpec(window.tokens_per_frame, window.window, window.ref_frames)
        )
        attn_flops[0] += frame_window_flops(B, N, L, H, spec)
        return v.clone()

    counter = FlopCounterMode(display=False)
    with mock.patch.object(Attention, "forward", counted_attention), force_eager(), counter:
        fn(*args)
    total = 0
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        name = str(op)
        if "scaled_dot_product" in name or "flex_attention" in name:
            continue  # counted above as useful FLOPs
        total += n
    return {"matmul_conv": int(total), "attention": int(attn_flops[0])}


def flops_report(flops, isolated, stage_med, wall_med, steps, chunk_frames) -> dict:
    by = flops.get("by_stage", {})
    total = sum(by.values())
    rep = {
        "per_chunk_by_stage": by,
        "per_chunk_total": total,
        "per_call": flops.get("per_call", []),
        "first_chunk_total": flops.get("first_chunk_total"),
    }
    if total:
        rep["achieved_tflops_pipeline"] = {
            s: by[s] / stage_med[s] / 1e12 for s in by if stage_med.get(s)
        }
        rep["achieved_tflops_isolated"] = {
            s: by[s] / isolated[s] / 1e12 for s in by if isolated.get(s)
        }
        rep["fraction_of_peak_isolated"] = {
            s: by[s] / isolated[s] / H200_BF16_PEAK for s in by if isolated.get(s)
        }
        rep["chunk_tflops"] = total / wall_med / 1e12
        rep["chunk_fraction_of_peak"] = total / wall_med / H200_BF16_PEAK
        rep["compute_floor_seconds_per_chunk"] = total / H200_BF16_PEAK
        rep["fps_ceiling_at_peak"] = chunk_frames / (total / H200_BF16_PEAK)
    return rep
