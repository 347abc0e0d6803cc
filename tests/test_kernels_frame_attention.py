"""CPU tests of the frame-window attention kernels, run by Triton's interpreter.

TRITON_INTERPRET=1 must be in the environment before triton is first imported. If another test
module imported triton earlier in this process (torch.compile does), the kernels here would be
GPU-compiled; then one test reruns this file in a fresh interpreter and the rest skip.

Every kernel result is checked against float64 attention under the dense mask: relative error
(Frobenius) <= 1e-2 and no NaN, on fresh random inputs per case, and on adversarial ones.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F_nn  # noqa: E402

from pipeline.kernels import (  # noqa: E402
    FrameWindowSpec,
    KernelConfig,
    bounded_softmax_share,
    frame_window_attention,
    frame_window_flops,
    frame_window_mask,
    frame_window_mask_mod,
    windowed_attention,
)
from pipeline.kernels._triton_frame_attention import interpreting  # noqa: E402
from pipeline.kernels.frame_attention import _launch  # noqa: E402

try:
    INTERPRETED = interpreting()
except RuntimeError:  # triton.language was imported before the variable was set
    INTERPRETED = False
needs_interpreter = pytest.mark.skipif(
    not INTERPRETED, reason="triton was imported before TRITON_INTERPRET=1; see the rerun test"
)


@pytest.mark.slow  # the whole module again
@pytest.mark.skipif(INTERPRETED, reason="the interpreter is active in this process")
def test_rerun_in_fresh_interpreter():
    assert "FACECAST_KERNEL_TEST_RERUN" not in os.environ, "the interpreter did not come up"
    env = dict(os.environ, TRITON_INTERPRET="1", FACECAST_KERNEL_TEST_RERUN="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def _qkv(seed, B, H, L, D, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=gen).to(dtype) for _ in range(3)]


def _reference(q, k, v, F, W, R, scale=None):
    mask = frame_window_mask(q.shape[2], tokens_per_frame=F, window=W, ref_frames=R)
    return F_nn.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask, scale=scale
    )


def _rel_err(out, ref):
    assert not torch.isnan(out).any(), "NaN in the kernel's output"
    return ((out.double() - ref).norm() / ref.norm()).item()


def _run(q, k, v, F, W, R, softmax="bounded", **kw):
    return frame_window_attention(
        q, k, v, tokens_per_frame=F, window=W, ref_frames=R, softmax=softmax, **kw
    )


# (seed, B, H, D, F, T, W, R): tiles 32/16 from F, both head dims, windows that clip at the
# ends and ones that do not, no and two reference frames, a single video frame.
CASES = [
    (1, 1, 2, 64, 32, 3, 1, 1),
    (2, 2, 1, 128, 32, 2, 1, 1),
    (3, 1, 2, 32, 48, 4, 2, 1),
    (4, 1, 1, 64, 16, 5, 0, 2),
    (5, 1, 1, 32, 32, 3, 1, 0),
    (6, 1, 2, 16, 64, 1, 1, 1),
]


@needs_interpreter
@pytest.mark.parametrize("softmax", ["bounded", "online"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "D{3}_F{4}_T{5}_W{6}_R{7}".format(*c))
def test_matches_float64_reference(case, softmax):
    seed, B, H, D, F, T, W, R = case
    L = (R + T) * F
    q, k, v = _qkv(seed + (100 if softmax == "online" else 0), B, H, L, D)
    out = _run(q, k, v, F, W, R, softmax)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel_err(out, _reference(q, k, v, F, W, R)) <= 1e-2


@needs_interpreter
def test_pointer_path_and_explicit_scale_match_reference():
    F, T, W, R = 32, 3, 1, 1
    q, k, v = _qkv(11, 1, 2, (R + T) * F, 64)
    cfg = KernelConfig(block_m=16, block_n=32, use_tma=False)
    out = _run(q, k, v, F, W, R, scale=0.3, config=cfg)
    assert _rel_err(out, _reference(q, k, v, F, W, R, scale=0.3)) <= 1e-2


@needs_interpreter
@pytest.mark.parametrize(
    "case", [(21, 32, 3, 1, 1), (22, 16, 2, 1, 1)], ids=["F32", "F16_one_block"]
)
def test_pipelined_qk_loop_matches_reference(case):
    # The software-pipelined loops (QK^T of block j+1 before block j's softmax), also
    # where a row block has a single key block (reference rows with F = BLOCK_N = 16).
    seed, F, T, W, R = case
    q, k, v = _qkv(seed, 1, 2, (R + T) * F, 64)
    cfg = KernelConfig(block_m=16, block_n=16, pipeline_qk=True)
    ref = _reference(q, k, v, F, W, R)
    for gap_limit, path in ((64.0, 1), (-1.0, 0)):  # bounded, then forced online
        out, flags = _launch(q, k, v, FrameWindowSpec(F, W, R), None, gap_limit, cfg)
        assert bool((flags == path).all())
        assert _rel_err(out, ref) <= 1e-2


@needs_interpreter
def test_random_inputs_take_the_bounded_path_and_online_forces_classic():
    F, T, W, R = 32, 3, 1, 1
    spec = FrameWindowSpec(F, W, R)
    q, k, v = _qkv(12, 1, 2, (R + T) * F, 64)
    _, flags = _launch(q, k, v, spec, None, 64.0, None)
    assert bool(flags.all())
    _, flags = _launch(q, k, v, spec, None, -1.0, None)
    assert not bool(flags.any())


@needs_interpreter
def test_huge_norm_keys_fall_back_and_stay_correct():
    F, T, W, R = 32, 4, 1, 1
    L = (R + T) * F
    q, k, v = _qkv(13, 1, 2, L, 64)
    # A few keys with norms ~1000x the rest, in video frame 3 (global frame 4) of head 0 only:
    # the bound of every row that sees them is hopeless, the true max is far below it.
    k[0, 0, 4 * F + 5] *= 1000
    k[0, 0, 4 * F + 20] *= -700
    spec = FrameWindowSpec(F, W, R)
    out, flags = _launch(q, k, v, spec, None, 64.0, None)
    assert _rel_err(out, _reference(q, k, v, F, W, R)) <= 1e-2
    blocks_per_frame = flags.shape[-1] // (R + T)
    by_frame = flags[0, 0].view(R + T, blocks_per_frame)
    # Rows of video frames 2..3 (global 3..4) see frame 4: online. The others stay bounded.
    assert not bool(by_frame[3:].any())
    assert bool(by_frame[:3].all())
    assert bool(flags[0, 1].all())


@needs_interpreter
def test_all_equal_keys_give_the_mean_value():
    F, T, W, R = 16, 3, 1, 1
    L = (R + T) * F
    q, k, v = _qkv(14, 1, 1, L, 32)
    k[:] = k[:, :, :1]  # every key the same: the bound is exact (radius 0)
    q *= 30  # large logits, still a uniform softmax
    out, flags = _launch(q, k, v, FrameWindowSpec(F, W, R), None, 64.0, None)
    assert bool(flags.all())
    ref = _reference(q, k, v, F, W, R)
    assert _rel_err(out, ref) <= 1e-2
    # Reference rows average the reference frame's values.
    ref_mean = v[0, 0, :F].double().mean(0)
    assert torch.allclose(out[0, 0, :F].double(), ref_mean.expand(F, -1), atol=2e-2)


@needs_interpreter
def test_loose_bound_rows_fall_back_per_row_block():
    F, T, W, R = 32, 3, 1, 1
    L = (R + T) * F
    q, k, v = _qkv(15, 1, 1, L, 64)
    q[0, 0, 2 * F : 2 * F + 16] *= 40  # first row block of global frame 2 only (block_m 16)
    cfg = KernelConfig(block_m=16, block_n=32)
    spec = FrameWindowSpec(F, W, R)
    out, flags = _launch(q, k, v, spec, None, 64.0, cfg)
    assert _rel_err(out, _reference(q, k, v, F, W, R)) <= 1e-2
    expected = torch.ones_like(flags)
    expected[0, 0, 4] = 0  # row block 4 = rows [64, 80)
    assert torch.equal(flags, expected)
    share = bounded_softmax_share(q, k, tokens_per_frame=F, window=W, ref_frames=R, block_m=16)
    assert share.heads == 0.0 and share.row_blocks == pytest.approx(7 / 8)


@needs_interpreter
def test_bounded_path_with_a_large_overshoot_is_still_exact():
    # A generous limit lets the bounded path run where the bound overshoots the row max by
    # tens of binades: the exponentials shrink but stay normal floats, and the result holds.
    F, T, W, R = 32, 3, 1, 1
    L = (R + T) * F
    q, k, v = _qkv(16, 1, 2, L, 64)
    q *= 6
    spec = FrameWindowSpec(F, W, R)
    share = bounded_softmax_share(q, k, tokens_per_frame=F, window=W, ref_frames=R)
    assert share.max_gap_BH.min().item() > 40
    out, flags = _launch(q, k, v, spec, None, 120.0, None)
    assert bool(flags.all())
    assert _rel_err(out, _reference(q, k, v, F, W, R)) <= 1e-2


@needs_interpreter
def test_share_agrees_with_the_kernel():
    F, T, W, R = 32, 3, 1, 1
    L = (R + T) * F
    q, k, v = _qkv(17, 1, 3, L, 32)
    q[0, 1] *= 12  # head 1: large logits everywhere
    q[0, 2, :F] *= 12  # head 2: only the reference rows
    spec = FrameWindowSpec(F, W, R)
    _, flags = _launch(q, k, v, spec, None, 64.0, None)
    share = bounded_softmax_share(q, k, tokens_per_frame=F, window=W, ref_frames=R)
    assert torch.equal(share.per_head_BH, flags.bool().flatten(2).all(-1))
    assert share.row_blocks == pytest.approx(flags.float().mean().item())


def test_bad_shapes_raise_clear_errors():
    q, k, v = _qkv(18, 1, 1, 4 * 40, 32)
    with pytest.raises(ValueError, match="multiple of 16"):
        _run(q, k, v, 40, 1, 1)
    with pytest.raises(ValueError, match="frame-major"):
        _run(q, k, v, 48, 1, 1)
    with pytest.raises(ValueError, match="softmax"):
        _run(q, k, v, 32, 1, 1, softmax="fast")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        _run(q.float(), k.float(), v.float(), 32, 1, 1)


def test_dense_mask_matches_the_contract_and_flops():
    F, W, R, T = 4, 1, 1, 5
    L = (R + T) * F
    mask = frame_window_mask(L, tokens_per_frame=F, window=W, ref_frames=R)
    frame = torch.arange(L) // F
    for qi in range(L):
        for ki in range(L):
            fq, fk = frame[qi].item(), frame[ki].item()
            want = fk < R or (fq >= R and fk >= R and abs(fq - fk) <= W)
            assert mask[qi, ki].item() == want
    spec = FrameWindowSpec(F, W, R)
    assert frame_window_flops(2, 3, L, 8, spec) == 4 * 8 * int(mask.sum()) * 2 * 3
    assert frame_window_flops(1, 1, L, 8, None) == 4 * 8 * L * L


def test_flex_mask_mod_and_block_mask_match_the_dense_mask():
    from torch.nn.attention.flex_attention import create_mask

    from pipeline.kernels import frame_window_block_mask

    F, W, R, T = 16, 1, 1, 4
    L = (R + T) * F
    dense = frame_window_mask(L, tokens_per_frame=F, window=W, ref_frames=R)
    mod = frame_window_mask_mod(tokens_per_frame=F, window=W, ref_frames=R)
    assert torch.equal(create_mask(mod, 1, 1, L, L, device="cpu")[0, 0], dense)
    bm = frame_window_block_mask(
        L, tokens_per_frame=F, window=W, ref_frames=R, device="cpu", block_size=16
    )
    # Aligned blocks: every block is full or empty, none partial.
    assert int(bm.kv_num_blocks.sum()) == 0
    blocks = dense.view(R + T, F, R + T, F).any(3).any(1)
    assert int(bm.full_kv_num_blocks.sum()) == int(blocks.sum())


def test_sdpa_and_flex_backends_agree_with_reference():
    F, W, R, T = 16, 1, 1, 3
    L = (R + T) * F
    q, k, v = (t.float() for t in _qkv(19, 1, 2, L, 16))
    ref = _reference(q, k, v, F, W, R)
    for backend in ("sdpa", "flex"):
        out = windowed_attention(
            q, k, v, backend=backend, tokens_per_frame=F, window=W, ref_frames=R
        )
        assert _rel_err(out, ref) <= 1e-4, backend
    with pytest.raises(ValueError, match="backend"):
        windowed_attention(q, k, v, backend="xformers", tokens_per_frame=F, window=W)


@needs_interpreter
def test_facecast_backend_dispatch():
    F, W, R, T = 16, 1, 1, 3
    q, k, v = _qkv(20, 1, 1, (R + T) * F, 32)
    out = windowed_attention(
        q, k, v, backend="facecast", tokens_per_frame=F, window=W, ref_frames=R
    )
    assert _rel_err(out, _reference(q, k, v, F, W, R)) <= 1e-2


@pytest.mark.parametrize("backend", ["int8", "cudnn", "fp8"])
def test_library_attention_that_cannot_run_falls_back_to_the_exact_path_saying_so_once(
    backend, caplog
):
    """`Attention("int8")` (SageAttention's INT8 QK kernels), `Attention("cudnn")` (cuDNN's
    fastest bf16 engine) and `Attention("fp8")` (cuDNN's FP8 kernels) where they cannot run —
    here a CPU; on a GPU, a head dim they lack, an older GPU or the library missing — give
    SDPA's exact result, and say why in one log line however many layers and calls meet it."""
    import logging

    from pipeline.models.attention import Attention, say_fallback

    say_fallback.cache_clear()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 48, 64, generator=g) for _ in range(3))
    layers = [Attention(backend), Attention(backend)]
    with caplog.at_level(logging.WARNING, logger="facecast.attention"):
        outs = [layer(q, k, v) for layer in layers for _ in range(2)]
    for out in outs:
        torch.testing.assert_close(out, F_nn.scaled_dot_product_attention(q, k, v), rtol=0, atol=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "facecast.attention"]
    assert len(lines) == 1 and f"'{backend}' falls back" in lines[0] and "GPU" in lines[0], lines


@pytest.mark.parametrize(
    "backend, module, refusal, kernel",
    [
        ("fp8", "fp8_attention", "fp8_refusal", "fp8_attention"),
        ("cudnn", "cudnn_attention", "cudnn_refusal", "tuned_attention"),
    ],
)
def test_a_shape_cudnn_declines_goes_to_the_exact_path_saying_so_once(
    backend, module, refusal, kernel, caplog, monkeypatch
):
    """Where cuDNN's kernels could run but cuDNN declines the shape (its graph has no plan
    for it), the layer still answers exactly, and the log says which shape and why."""
    import importlib
    import logging

    from pipeline.models.attention import Attention, say_fallback

    kernels = importlib.import_module(f"pipeline.kernels.{module}")
    say_fallback.cache_clear()
    declined = "cuDNN declined q (1, 2, 48, 64), k (1, 2, 48, 64): no engine"
    monkeypatch.setattr(kernels, refusal, lambda q: None)
    monkeypatch.setattr(kernels, kernel, lambda q, k, v: declined)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 48, 64, generator=g) for _ in range(3))
    with caplog.at_level(logging.WARNING, logger="facecast.attention"):
        outs = [Attention(backend)(q, k, v) for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, F_nn.scaled_dot_product_attention(q, k, v), rtol=0, atol=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "facecast.attention"]
    assert lines == [f"attention '{backend}' falls back to torch's exact SDPA: {declined}"]


def test_fp8_scaling_maps_each_tensor_onto_e4m3s_range_and_back():
    """The per-call scale puts a tensor's largest magnitude at e4m3's 448, so the values
    come back within e4m3's rounding (3 mantissa bits) times the descale."""
    from pipeline.kernels.fp8_attention import E4M3_MAX, per_tensor_e4m3

    g = torch.Generator().manual_seed(3)
    for scale in (1e-3, 1.0, 50.0):
        x = (scale * torch.randn(1, 2, 64, 64, generator=g)).to(torch.bfloat16)
        x8, descale = per_tensor_e4m3(x)
        assert x8.dtype == torch.float8_e4m3fn and descale.shape == (1, 1, 1, 1)
        assert x8.float().abs().max() == E4M3_MAX
        back = x8.float() * descale
        big = x.float().abs() > scale * 0.05  # away from e4m3's subnormals
        rel = ((back - x.float()).abs() / x.float().abs())[big]
        assert rel.max() <= 2**-4 + 1e-3  # half a unit in the last of 3 mantissa bits
