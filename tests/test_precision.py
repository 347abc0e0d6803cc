"""FP8 linear layers: the same function as the bf16 layer they replace, within e4m3's
rounding, and a clear refusal where there are no FP8 tensor cores."""

from __future__ import annotations

import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.gate import GateReport, precision_tier
from pipeline.precision import (
    STATIC_HEADROOM,
    Fp8Linear,
    apply_fp8,
    fp8_layers,
)


@pytest.mark.parametrize("bias", [True, False])
def test_fp8_linear_matches_the_layer_it_replaces(bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 192, bias=bias).to(torch.bfloat16)
    fp8 = Fp8Linear(layer)
    for scale in (1e-3, 1.0, 300.0):  # per-token scales: any activation range works
        x = scale * torch.randn(3, 64, 128, dtype=torch.bfloat16)
        want, got = layer(x).float(), fp8(x).float()
        assert got.shape == want.shape and got.dtype == torch.float32
        assert torch.isfinite(got).all()
        # e4m3 keeps 3 mantissa bits: ~2-4% relative error on a product, not more
        assert (got - want).norm() / want.norm() < 0.06
    assert fp8.weight.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("bias", [True, False])
def test_static_fp8_linear_matches_within_its_calibrated_range(bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 192, bias=bias).to(torch.bfloat16)
    calibration = 2.0 * torch.randn(3, 64, 128, dtype=torch.bfloat16)
    fp8 = Fp8Linear(layer, input_amax=calibration.abs().amax())
    assert fp8.static and fp8.input_scale.numel() == 1 and fp8.weight_scale.numel() == 1
    for scale in (0.5, 2.0, 2.0 * STATIC_HEADROOM):  # up to the headroom: no saturation
        x = scale * torch.randn(3, 64, 128, dtype=torch.bfloat16).clamp(-3, 3)
        want, got = layer(x).float(), fp8(x).float()
        assert (got - want).norm() / want.norm() < 0.06
    # far beyond the calibration the input saturates at e4m3's largest value: finite, bounded
    huge = fp8(1e4 * torch.ones(1, 128, dtype=torch.bfloat16)).float()
    assert torch.isfinite(huge).all()


def test_fp8_fast_asks_the_gemm_for_fast_accumulation(monkeypatch):
    """`--precision fp8-fast`: the static layers, their GEMMs in the fast accumulation mode
    (what a GPU's kernel does with it; the CPU's reference accumulates exactly either way)."""
    from pipeline.startup import FP8_FAST_ACCUM, FP8_SCALING, PRECISIONS

    assert "fp8-fast" in PRECISIONS and FP8_SCALING["fp8-fast"] == "static"
    assert FP8_FAST_ACCUM == {"fp8-fast"}
    asked = []
    scaled_mm = torch._scaled_mm

    def recording(*args, **kwargs):
        asked.append(kwargs["use_fast_accum"])
        return scaled_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 64).to(torch.bfloat16)
    x = torch.randn(8, 128, dtype=torch.bfloat16)
    exact, fast = (Fp8Linear(layer, x.abs().amax(), fast_accum=f) for f in (False, True))
    want = exact(x)
    torch.testing.assert_close(fast(x), want)  # the same products here
    assert asked == [False, True]


def test_fp8_needs_an_fp8_gpu(tiny_engine):
    with pytest.raises(ConfigError, match="FP8 GPU"):
        apply_fp8(tiny_engine)


def test_precision_tier_passes_on_its_own_floor():
    report = GateReport(False, None, 10, 0, 34.0, 38.0, 48.5, 48.0, "rejected")
    assert precision_tier(report, 30.0).passed and precision_tier(report, 30.0).tier == 3
    assert not precision_tier(report, 35.0).passed


def test_precision_tier_says_how_much_more_error_than_reordering_alone():
    # 6.02 dB below the band is twice the RMS error of bf16's own reassociation
    report = GateReport(False, None, 3, 0, 25.66, 30.0, 31.68, 31.18, "rejected", [25.66] * 3)
    tier = precision_tier(report, 30.0)
    assert not tier.passed and "2.00x its error" in tier.message


def _report(worst: float, pooled: float, band_worst: float, band_pooled: float, spread: float):
    return GateReport(
        False, None, 75, 0, worst, pooled + 1, band_worst, band_worst - spread, "rejected",
        psnr_pooled=pooled, band_psnr_pooled=band_pooled, worst_allowance_db=spread,
    )  # fmt: skip


def test_precision_tier_where_bf16_itself_falls_under_the_floor_judges_by_the_band():
    # FlashHead Pro on an H100 (2026-12-05): one reordering of bf16's sums put a seam frame
    # at 28.3 dB; FP8's lowest frame was as low, its error over all frames 1.37x bf16's
    fp8 = precision_tier(_report(28.16, 34.46, 28.33, 37.19, 4.29), 30.0)
    assert fp8.passed and fp8.tier == 3
    assert fp8.threshold_db == pytest.approx(28.33 - 4.29)
    assert "1.37x its error" in fp8.message and "already under 30.0" in fp8.message
    # its error over all frames is still held to the floor
    assert not precision_tier(_report(28.16, 29.5, 28.33, 37.19, 4.29), 30.0).passed
    # and a frame far under what bf16's own reorderings reach is caught
    assert not precision_tier(_report(23.0, 34.46, 28.33, 37.19, 4.29), 30.0).passed


def test_precision_tier_keeps_its_floor_on_the_lowest_frame_where_bf16_meets_it():
    # LiveAvatar's band sits at 45 dB: its lowest frame must reach the floor itself
    assert not precision_tier(_report(29.5, 36.0, 45.1, 46.0, 0.8), 30.0).passed
    assert precision_tier(_report(32.6, 36.0, 45.1, 46.0, 0.8), 30.0).passed


@pytest.mark.slow
def test_an_engine_with_emulated_fp8_streams_close_to_its_own_precision():
    """What bench/fp8_quality.py measures: calibration over the warm-up session records
    every layer's input, then the same stream with FP8 linears gives frames close to the
    engine's own precision (the tiny config's random weights: a loose bound)."""
    import numpy as np

    from pipeline.clock import MODEL_RATE
    from pipeline.config import load_config
    from pipeline.diffusion.engine import Engine
    from pipeline.precision import Fp8Linear

    cfg = load_config("tiny")
    base, fp8 = Engine.load(cfg, "cpu"), Engine.load(cfg, "cpu")
    originals = [getattr(parent, attr) for parent, attr in fp8_layers(fp8, "static")]
    swapped = apply_fp8(fp8, "static", emulate=True)
    assert swapped == len(originals) > 0
    assert all(not lin._forward_pre_hooks for lin in originals)  # calibration's hooks are gone
    replaced = [getattr(parent, attr) for parent, attr in fp8_layers(fp8, "static")]
    assert all(isinstance(lin, Fp8Linear) and lin.static for lin in replaced)
    assert all(float(lin.input_scale) > 0 for lin in replaced)  # every layer saw an input
    reference = np.full((cfg.video.height, cfg.video.width, 3), 120, np.uint8)
    audio = (0.1 * np.sin(np.arange(MODEL_RATE) * 0.05)).astype(np.float32)  # one second
    frames = []
    for engine in (base, fp8):
        stream = engine.new_stream(reference, seed=0)
        stream.push_audio(audio)
        frames.append(np.concatenate([b.frames for b in stream.finish()]))
        stream.close()
    assert frames[0].shape == frames[1].shape
    diff = np.abs(frames[0].astype(np.int16) - frames[1]).mean()
    assert diff < 8.0, diff  # grey levels; FP8 perturbs, it does not break the picture


def test_tanh_gelu_is_torchs_tanh_gelu_compiled_or_not():
    """`TanhGelu` (what an FFN's GELU becomes in front of an FP8 linear) is the same
    function: eager it is torch's kernel, compiled it is the logistic form, equal to float32
    rounding over the whole range and finite at its ends."""
    from pipeline.precision import TanhGelu, logistic_tanh_gelu

    x = torch.cat([torch.linspace(-30, 30, 20001), torch.tensor([-1e4, 1e4, -1e30, 1e30])])
    want = torch.nn.functional.gelu(x.double(), approximate="tanh")
    got = logistic_tanh_gelu(x).double()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
    gelu = TanhGelu()
    assert torch.equal(gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))
    torch.testing.assert_close(torch.compile(gelu)(x).double(), want, rtol=2e-6, atol=1e-6)
    h = torch.randn(64, 96, dtype=torch.bfloat16)  # bf16 in, bf16 out, as in the FFN
    assert logistic_tanh_gelu(h).dtype == torch.bfloat16


def test_the_gpu_quantisation_rounds_as_the_eager_one_within_range():
    """`scaled_e4m3_on_gpu` (compiled on a GPU: a reciprocal, no clamp, the conversion
    saturating by itself) gives the eager quantisation's e4m3 values for every input in
    range; at most a rounding tie lands on the neighbouring value."""
    from pipeline.precision import E4M3_MAX, scaled_e4m3, scaled_e4m3_on_gpu

    torch.manual_seed(0)
    descale = torch.tensor(0.0123)
    x = (torch.rand(1 << 16) * 2 - 1) * E4M3_MAX * float(descale)
    eager, gpu = scaled_e4m3(x, descale).float(), scaled_e4m3_on_gpu(x, descale).float()
    differ = eager != gpu
    assert differ.float().mean() < 1e-3
    assert ((eager - gpu).abs()[differ] <= eager.abs()[differ] / 8).all()  # one e4m3 step


def test_fp8_turns_the_ffn_gelus_before_fp8_linears_into_tanh_gelu(tiny_engine):
    """`apply_fp8` swaps each FFN's tanh-GELU that feeds an FP8 linear, and only those."""
    from pipeline.precision import TanhGelu, logistic_gelus

    blocks = [
        b for name in ("a2v", "sr") for b in tiny_engine.modules[name].model.transformer.blocks
    ]
    layers = fp8_layers(tiny_engine, "static")
    assert logistic_gelus(layers) == len(blocks)
    assert all(isinstance(b.mlp[1], TanhGelu) for b in blocks)
    assert logistic_gelus(layers) == 0  # nothing left to swap
    assert logistic_gelus([(torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(2, 2)), "1")]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_layer_norm_is_torchs_compiled_or_not(dtype):
    """`LayerNorm` (the Wan blocks' norms): torch's own eager, the two-pass form compiled
    (not Welford's running update), equal to float rounding, with the same checkpoint keys,
    also on rows far from zero mean."""
    from pipeline.models.layers import LayerNorm

    torch.manual_seed(0)
    ours, torchs = LayerNorm(96, eps=1e-6), torch.nn.LayerNorm(96, eps=1e-6)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
    torchs.load_state_dict(ours.state_dict())
    assert ours.state_dict().keys() == torchs.state_dict().keys()
    assert LayerNorm(96, elementwise_affine=False).state_dict() == {}
    x = torch.randn(4, 33, 96) * 3
    x[0] += 1e3  # a row far from zero mean: centred first, nothing cancels
    x = x.to(dtype)
    ours, torchs = ours.to(dtype), torchs.to(dtype)
    with torch.no_grad():
        want = torchs(x)
        assert torch.equal(ours(x), want)
        got = torch.compile(ours)(x)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: one rounding step apart
    torch.testing.assert_close(got[1:].float(), want[1:].float(), rtol=tolerance, atol=tolerance)
    # the far row: both lose what float32 cannot hold of a mean 300 standard deviations out
    worst = (got[0].float() - want[0].float()).abs().max().item()
    assert worst < (1e-3 if dtype == torch.float32 else 0.1), worst


@pytest.mark.parametrize("static", [True, False])
def test_fp8_linear_compiled_takes_tokens_held_transposed(static):
    """A DiT's first block gets its tokens as a transposed view of the patch embedding, and
    a compiled norm before the layer keeps those strides: the FP8 GEMM takes its left
    operand only row-major ("mat_a must be row_major"), so the layer hands it rows, and
    the compiled norm returns rows as torch's LayerNorm does. On the H200 the compiled FP8
    path failed on FlashHead's first block until both did."""
    from pipeline.models.layers import LayerNorm
    from pipeline.precision import Fp8Linear

    torch.manual_seed(0)
    norm = LayerNorm(64, eps=1e-6).to(torch.bfloat16)
    fp8 = Fp8Linear(
        torch.nn.Linear(64, 96).to(torch.bfloat16), torch.tensor(4.0) if static else None
    )
    x_BLD = torch.randn(1, 64, 32, dtype=torch.bfloat16).transpose(1, 2)  # (B, L, D), D strided
    with torch.no_grad():
        assert torch.compile(lambda x: norm(x))(x_BLD).is_contiguous()
        got = torch.compile(lambda x: fp8(norm(x)))(x_BLD)
        want = fp8(norm(x_BLD.contiguous()))
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)
