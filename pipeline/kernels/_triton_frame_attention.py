"""Triton kernels behind frame_attention.py: key statistics pre-pass and the block-sparse forward.

Tensors are seen flattened: q, k, v, o as (B*H*L, D) row-major, one row per token, so the rows of
head bh are [bh*L, (bh+1)*L). Frames are F rows. Legend: BM = BLOCK_M (query rows per program),
BN = BLOCK_N (keys per inner step), D = HEAD_DIM, NF = R + T frames.

With TRITON_INTERPRET=1 set before triton is first imported, `triton.jit` gives interpreted
kernels that run on CPU tensors (the CPU tests); `interpreting()` says which mode is active.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round_like_gpu(x, io_dtype: tl.constexpr):
    """x (fp32) rounded to io_dtype's precision, kept in fp32: the interpreter only.

    Its fp32 -> bf16 cast truncates where the GPU rounds to nearest even, which would double
    the error the CPU tests see; do the rounding on the bits instead.
    """
    if io_dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = bits.to(tl.float32, bitcast=True)
    else:
        y = x.to(io_dtype).to(tl.float32)
    return y


@triton.jit
def _frame_key_stats(
    K,  # (B*H*L, D) keys
    Cm,  # out (B*H*NF, D) fp32: mean key of each frame
    Rad,  # out (B*H*NF,) fp32: max over the frame's keys of ||k - frame mean||
    L,
    F,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """One program per (frame, bh): two passes over the frame's F keys (the second hits L2)."""
    g = tl.program_id(0)
    bh = tl.program_id(1)
    nf = tl.num_programs(0)
    offs_r = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    first_row = bh.to(tl.int64) * L + g * F
    ptrs = K + (first_row + offs_r)[:, None] * HEAD_DIM + offs_d[None, :]

    total = tl.zeros([HEAD_DIM], tl.float32)
    for r0 in range(0, F, BLOCK):
        total += tl.sum(tl.load(ptrs + r0 * HEAD_DIM).to(tl.float32), 0)
    mean = total / F

    sq_max = tl.zeros([BLOCK], tl.float32)
    for r0 in range(0, F, BLOCK):
        d = tl.load(ptrs + r0 * HEAD_DIM).to(tl.float32) - mean[None, :]
        sq_max = tl.maximum(sq_max, tl.sum(d * d, 1))

    stat = bh * nf + g
    tl.store(Cm + stat * HEAD_DIM + offs_d, mean)
    tl.store(Rad + stat, tl.sqrt(tl.max(sq_max, 0)))


@triton.jit
def _load_rows(X, row0, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr):
    """ROWS consecutive rows from row0 of a (rows, HEAD_DIM) tensor: a TMA tile or plain loads."""
    if USE_TMA:
        tile = X.load([row0, 0])
    else:
        rows = row0.to(tl.int64) + tl.arange(0, ROWS)
        tile = tl.load(X + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :])
    return tile


@triton.jit
def _store_rows(X, row0, val, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr):
    if USE_TMA:
        X.store([row0, 0], val)
    else:
        rows = row0.to(tl.int64) + tl.arange(0, ROWS)
        tl.store(X + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], val)


@triton.jit
def _key_block_row(j, head_row, n_ref, jump, BLOCK_N: tl.constexpr):
    """First row of key block j: the reference span's blocks, then the window's."""
    return head_row + j * BLOCK_N + tl.where(j >= n_ref, jump, 0)


@triton.jit
def _scores(q, K, row, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr,
            UPCAST: tl.constexpr):  # fmt: skip
    k = _load_rows(K, row, BLOCK_N, HEAD_DIM, USE_TMA)
    if UPCAST:
        k = k.to(tl.float32)
    return tl.dot(q, tl.trans(k))


@triton.jit
def _accumulate(acc, p, V, row, io_dtype: tl.constexpr, BLOCK_N: tl.constexpr,
                HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """acc += p @ v, with p rounded to the input dtype as the tensor cores take it."""
    v = _load_rows(V, row, BLOCK_N, HEAD_DIM, USE_TMA)
    if UPCAST:
        acc = tl.dot(_round_like_gpu(p, io_dtype), v.to(tl.float32), acc)
    else:
        acc = tl.dot(p.to(io_dtype), v, acc)
    return acc


@triton.jit
def _online_step(acc, m_i, l_i, s, qk_scale, V, row, io_dtype: tl.constexpr,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr,
                 UPCAST: tl.constexpr):  # fmt: skip
    """One key block of the online softmax: raise the running max, rescale acc and l."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # qk_scale > 0
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _accumulate(acc * alpha[:, None], p, V, row, io_dtype, BLOCK_N, HEAD_DIM, USE_TMA,
                      UPCAST)  # fmt: skip
    return acc, m_new, l_i


@triton.jit
def _frame_attention_fwd(  # noqa: C901 - a Triton kernel is one function; its branches are compile-time constants
    Q,  # (B*H*L, D) bf16/fp16: a pointer, or a TensorDescriptor when USE_TMA
    K,
    V,
    O,  # noqa: E741  (out, same layout and dtype as Q)
    Cm,  # (B*H*NF, D) fp32 frame key means, from _frame_key_stats
    Rad,  # (B*H*NF,) fp32 frame key radii
    Flags,  # out (B*H*NUM_MB,) int8: 1 where the row block ran the bounded softmax
    qk_scale,  # softmax scale * log2(e): logits are kept in log2 units, so exp2 does the work
    gap_limit,  # log2 units; row blocks whose bound may overshoot more fall back to online
    L,
    F,
    T,
    W,
    R,
    NUM_MB,  # row blocks per head, L // BLOCK_M
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_TMA: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter only: its bf16 dot multiplies raw bits, so dot in fp32
    WARP_SPEC: tl.constexpr,
    PIPE_QK: tl.constexpr,  # issue block j+1's QK^T before block j's softmax (both paths)
):
    # Reference-frame row blocks do the least work (R*F keys); rotating them to the end of
    # each head's launch order puts the light programs in the last wave.
    ref_mb = R * F // BLOCK_M
    pid_m = (tl.program_id(0) + ref_mb) % NUM_MB
    bh = tl.program_id(1)
    nf = R + T
    start_m = pid_m * BLOCK_M
    frame = start_m // F  # BLOCK_M divides F: the whole row block lies in one frame

    # Visible key frames: [0, R) and the window [win_lo, win_hi) (empty for reference rows).
    vid = frame - R
    is_video = frame >= R
    win_lo = tl.where(is_video, R + tl.maximum(vid - W, 0), R)
    win_hi = tl.where(is_video, R + tl.minimum(vid + W, T - 1) + 1, R)

    offs_d = tl.arange(0, HEAD_DIM)
    head_row = bh * L  # row of this (b, h)'s first token; B*H*L < 2**31 (checked by the caller)
    q = _load_rows(Q, head_row + start_m, BLOCK_M, HEAD_DIM, USE_TMA)
    io_dtype: tl.constexpr = q.dtype

    # ---- the bound: mean-centre the visible keys, then Cauchy-Schwarz ----------------------
    # mu = mean of the visible keys (frames have equal length, so the mean of frame means);
    # rad >= max ||k - mu|| over visible keys, by the triangle inequality per frame.
    stat0 = bh * nf
    n_vis = R + (win_hi - win_lo)
    mu = tl.zeros([HEAD_DIM], tl.float32)
    for g in range(0, R):
        mu += tl.load(Cm + (stat0 + g) * HEAD_DIM + offs_d)
    for g in range(win_lo, win_hi):
        mu += tl.load(Cm + (stat0 + g) * HEAD_DIM + offs_d)
    mu = mu / n_vis
    rad = tl.full([], 0.0, tl.float32)
    for g in range(0, R):
        dc = tl.load(Cm + (stat0 + g) * HEAD_DIM + offs_d) - mu
        rad = tl.maximum(rad, tl.load(Rad + stat0 + g) + tl.sqrt(tl.sum(dc * dc, 0)))
    for g in range(win_lo, win_hi):
        dc = tl.load(Cm + (stat0 + g) * HEAD_DIM + offs_d) - mu
        rad = tl.maximum(rad, tl.load(Rad + stat0 + g) + tl.sqrt(tl.sum(dc * dc, 0)))
    qf = q.to(tl.float32)
    q_norm = tl.sqrt(tl.sum(qf * qf, 1))
    # Every logit (log2 units) is <= qk_scale*(q.mu + |q| rad) = m_bound, and the row max is
    # >= the row mean = qk_scale*q.mu, so the bound overshoots the true max by at most `gap`.
    gap = qk_scale * q_norm * rad
    m_bound = qk_scale * tl.sum(qf * mu[None, :], 1) + gap
    bounded = tl.max(gap, 0) <= gap_limit  # gap_limit < 0 forces the online path
    if UPCAST:
        q = qf

    # ---- key loop: reference span, then window span; only full blocks, no predicate --------
    n_ref = R * F // BLOCK_N
    n_blocks = n_ref + (win_hi - win_lo) * F // BLOCK_N  # >= 1: every row sees a frame
    jump = (win_lo - R) * F  # from the end of the reference span to the window's first key
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if bounded:
        # Fixed max: no running max, no rescale of acc and l; blocks stream independently.
        if PIPE_QK:
            row = _key_block_row(0, head_row, n_ref, jump, BLOCK_N)
            s = _scores(q, K, row, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
            for j in tl.range(1, n_blocks, warp_specialize=WARP_SPEC):
                row_next = _key_block_row(j, head_row, n_ref, jump, BLOCK_N)
                s_next = _scores(q, K, row_next, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
                p = tl.math.exp2(s * qk_scale - m_bound[:, None])
                l_i += tl.sum(p, 1)
                acc = _accumulate(acc, p, V, row, io_dtype, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
                s = s_next
                row = row_next
            p = tl.math.exp2(s * qk_scale - m_bound[:, None])
            l_i += tl.sum(p, 1)
            acc = _accumulate(acc, p, V, row, io_dtype, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
        else:
            for j in tl.range(0, n_blocks, warp_specialize=WARP_SPEC):
                row = _key_block_row(j, head_row, n_ref, jump, BLOCK_N)
                s = _scores(q, K, row, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
                p = tl.math.exp2(s * qk_scale - m_bound[:, None])
                l_i += tl.sum(p, 1)
                acc = _accumulate(acc, p, V, row, io_dtype, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
    else:
        # The classic online softmax: running max m_i, and a rescale whenever it rises.
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        if PIPE_QK:
            row = _key_block_row(0, head_row, n_ref, jump, BLOCK_N)
            s = _scores(q, K, row, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
            for j in tl.range(1, n_blocks, warp_specialize=WARP_SPEC):
                row_next = _key_block_row(j, head_row, n_ref, jump, BLOCK_N)
                s_next = _scores(q, K, row_next, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
                acc, m_i, l_i = _online_step(
                    acc, m_i, l_i, s, qk_scale, V, row, io_dtype, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST
                )
                s = s_next
                row = row_next
            acc, m_i, l_i = _online_step(
                acc, m_i, l_i, s, qk_scale, V, row, io_dtype, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST
            )
        else:
            for j in tl.range(0, n_blocks, warp_specialize=WARP_SPEC):
                row = _key_block_row(j, head_row, n_ref, jump, BLOCK_N)
                s = _scores(q, K, row, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST)
                acc, m_i, l_i = _online_step(
                    acc, m_i, l_i, s, qk_scale, V, row, io_dtype, BLOCK_N, HEAD_DIM, USE_TMA, UPCAST
                )

    out = acc / l_i[:, None]
    if UPCAST:
        out = _round_like_gpu(out, io_dtype)
    _store_rows(O, head_row + start_m, out.to(io_dtype), BLOCK_M, HEAD_DIM, USE_TMA)
    tl.store(Flags + bh * NUM_MB + pid_m, bounded.to(tl.int8))


def interpreting() -> bool:
    """True when the kernels run in Triton's CPU interpreter, False when they compile for CUDA.

    Raises if the two disagree: TRITON_INTERPRET=1 was set after triton.language was imported,
    so our kernels are interpreted but the library functions they call (tl.zeros...) are not.
    """
    from triton.runtime.interpreter import InterpretedFunction

    ours = isinstance(_frame_attention_fwd, InterpretedFunction)
    library = isinstance(tl.zeros, InterpretedFunction)
    if ours != library:
        raise RuntimeError(
            "TRITON_INTERPRET changed after triton was imported: set it before anything "
            "imports triton (torch.compile does), or run in a fresh process"
        )
    return ours
