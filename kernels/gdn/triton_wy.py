"""Triton kernels for the gated delta rule's WY form: the intra-chunk solve and the products it feeds.

Per chunk of C = 64 tokens (kernels/gdn/README.md derives every formula):

    A = strictly-lower(diag(beta) (D o K K^T)),   T = (I + A)^-1       gdn_fwd_kernel_wy_solve
    U = T diag(beta) V,   W = T diag(beta exp(gc)) K,   KE = diag(exp(gc_C - gc)) K     gdn_fwd_kernel_wy_apply

The solve inverts the four 16 x 16 diagonal blocks of I + A by forward substitution in registers (all four
at once, one row per step) and composes the off-diagonal blocks of T from them with products
(T_ij = -T_ii sum_{j <= m < i} A_im T_mj). A passes through the chunk's slot of the ``inverse`` output on
its way to the block loads; a barrier orders the program's stores before its loads. The block products of
the solve take float32 operands at the launch's ``PRECISION``; K K^T and the WY products take theirs in the
inputs' dtype (16-bit products with float32 accumulation for 16-bit inputs), transposed operands loaded
transposed from memory. Padded tokens load as k = v = 0, g = beta = 0.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_chunk_gates(g, beta, i_b, i_h, i_n, T, H: tl.constexpr, C: tl.constexpr):
    """(gc [C], beta [C]) of chunk i_n, float32, zero past the sequence: gc is the chunk-local inclusive cumsum."""
    token = i_n * C + tl.arange(0, C)
    offset = (i_b * T + token).to(tl.int64) * H + i_h
    b_g = tl.load(g + offset, mask=token < T, other=0.0).to(tl.float32)
    b_beta = tl.load(beta + offset, mask=token < T, other=0.0).to(tl.float32)
    return tl.cumsum(b_g, axis=0), b_beta


@triton.jit
def decay_matrix(b_gc, INCLUSIVE: tl.constexpr, C: tl.constexpr):
    """D [C, C]: exp(gc_t - gc_j) for j <= t (j < t unless INCLUSIVE), zero elsewhere; every exponent used is <= 0."""
    o_c = tl.arange(0, C)
    if INCLUSIVE:
        mask = o_c[:, None] >= o_c[None, :]
    else:
        mask = o_c[:, None] > o_c[None, :]
    return tl.where(mask, tl.exp(tl.where(mask, b_gc[:, None] - b_gc[None, :], 0.0)), 0.0)


@triton.jit
def _load_block(base, row: tl.constexpr, column: tl.constexpr, C: tl.constexpr, BC: tl.constexpr):
    o_i = tl.arange(0, BC)
    return tl.load(base + (row * BC + o_i)[:, None] * C + column * BC + o_i[None, :])


@triton.jit
def _store_block(base, b_block, row: tl.constexpr, column: tl.constexpr, C: tl.constexpr, BC: tl.constexpr):
    o_i = tl.arange(0, BC)
    tl.store(base + (row * BC + o_i)[:, None] * C + column * BC + o_i[None, :], b_block)


@triton.jit
def gdn_fwd_kernel_wy_solve(
    k, g, beta, gate_cumsum, chunk_decay, inverse, T, N, first_chunk,
    H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
):
    # One program per (chunk, batch * head): gc and exp(gc_C) of the chunk, then T = (I + A)^-1 [C, C].
    i_n, i_bh = tl.program_id(0) + first_chunk, tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    chunk = i_bh.to(tl.int64) * N + i_n
    o_c = tl.arange(0, C)
    b_gc, b_beta = load_chunk_gates(g, beta, i_b, i_h, i_n, T, H, C)
    tl.store(gate_cumsum + chunk * C + o_c, b_gc)
    tl.store(chunk_decay + chunk, tl.exp(tl.sum(tl.where(o_c == C - 1, b_gc, 0.0), axis=0)))
    b_kk = tl.zeros([C, C], dtype=tl.float32)
    key_base = (i_b * T * H + i_h).to(tl.int64) * K
    for i_k in range(tl.cdiv(K, BK)):
        p_k = tl.make_block_ptr(k + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        p_k_t = tl.make_block_ptr(k + key_base, (K, T), (1, H * K), (i_k * BK, i_n * C), (BK, C), (0, 1))
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        b_kk += tl.dot(b_k, tl.load(p_k_t, boundary_check=(0, 1), padding_option="zero"), input_precision=PRECISION)
    b_a = b_beta[:, None] * decay_matrix(b_gc, False, C) * b_kk
    base = inverse + chunk * C * C
    tl.store(base + o_c[:, None] * C + o_c[None, :], b_a)
    tl.debug_barrier()
    # the diagonal blocks, [C // BC, BC, BC]: row i of every block from its rows above, at once
    o_block = tl.arange(0, C // BC)
    o_i = tl.arange(0, BC)
    b_diag = tl.zeros([C // BC, BC, BC], dtype=tl.float32)
    for i in range(BC):
        b_row = tl.load(base + o_block[:, None] * BC * (C + 1) + i * C + o_i[None, :])
        b_new = tl.where(o_i[None, :] == i, 1.0, 0.0) - tl.sum(b_row[:, :, None] * b_diag, axis=1)
        b_diag = tl.where(o_i[None, :, None] == i, b_new[:, None, :], b_diag)
    b_a10 = _load_block(base, 1, 0, C, BC)
    b_a20 = _load_block(base, 2, 0, C, BC)
    b_a21 = _load_block(base, 2, 1, C, BC)
    b_a30 = _load_block(base, 3, 0, C, BC)
    b_a31 = _load_block(base, 3, 1, C, BC)
    b_a32 = _load_block(base, 3, 2, C, BC)
    tl.debug_barrier()
    tl.store(base + o_block[:, None, None] * BC * (C + 1) + o_i[None, :, None] * C + o_i[None, None, :], b_diag)
    tl.debug_barrier()
    b_t00 = _load_block(base, 0, 0, C, BC)
    b_t11 = _load_block(base, 1, 1, C, BC)
    b_t22 = _load_block(base, 2, 2, C, BC)
    b_t33 = _load_block(base, 3, 3, C, BC)
    b_t10 = -tl.dot(b_t11, tl.dot(b_a10, b_t00, input_precision=PRECISION), input_precision=PRECISION)
    b_t21 = -tl.dot(b_t22, tl.dot(b_a21, b_t11, input_precision=PRECISION), input_precision=PRECISION)
    b_t32 = -tl.dot(b_t33, tl.dot(b_a32, b_t22, input_precision=PRECISION), input_precision=PRECISION)
    b_s20 = tl.dot(b_a20, b_t00, input_precision=PRECISION) + tl.dot(b_a21, b_t10, input_precision=PRECISION)
    b_t20 = -tl.dot(b_t22, b_s20, input_precision=PRECISION)
    b_s31 = tl.dot(b_a31, b_t11, input_precision=PRECISION) + tl.dot(b_a32, b_t21, input_precision=PRECISION)
    b_t31 = -tl.dot(b_t33, b_s31, input_precision=PRECISION)
    b_s30 = tl.dot(b_a30, b_t00, input_precision=PRECISION) + tl.dot(b_a31, b_t10, input_precision=PRECISION)
    b_s30 += tl.dot(b_a32, b_t20, input_precision=PRECISION)
    b_t30 = -tl.dot(b_t33, b_s30, input_precision=PRECISION)
    _store_block(base, b_t10, 1, 0, C, BC)
    _store_block(base, b_t20, 2, 0, C, BC)
    _store_block(base, b_t21, 2, 1, C, BC)
    _store_block(base, b_t30, 3, 0, C, BC)
    _store_block(base, b_t31, 3, 1, C, BC)
    _store_block(base, b_t32, 3, 2, C, BC)


@triton.jit
def gdn_fwd_kernel_wy_apply(
    k, v, beta, gate_cumsum, inverse, updates, keys_in, keys_out, T, N, first_chunk,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr, UPDATES: tl.constexpr,
):
    # One program per (chunk, batch * head): U = T (beta v) (with UPDATES), W = T (beta exp(gc) k) and
    # KE = exp(gc_C - gc) k, stored chunk by chunk ([B, H, N, C, *], in the outputs' dtype) for the state pass.
    i_n, i_bh = tl.program_id(0) + first_chunk, tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    chunk = i_bh.to(tl.int64) * N + i_n
    o_c = tl.arange(0, C)
    token = i_n * C + o_c
    b_beta = tl.load(beta + (i_b * T + token).to(tl.int64) * H + i_h, mask=token < T, other=0.0).to(tl.float32)
    b_gc = tl.load(gate_cumsum + chunk * C + o_c)
    b_last = tl.sum(tl.where(o_c == C - 1, b_gc, 0.0), axis=0)
    dt = k.dtype.element_ty
    b_t = tl.load(inverse + chunk * C * C + o_c[:, None] * C + o_c[None, :]).to(dt)
    if UPDATES:
        value_base = (i_b * T * H + i_h).to(tl.int64) * V
        for i_v in range(tl.cdiv(V, BV)):
            p_v = tl.make_block_ptr(v + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
            b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_u = tl.dot(b_t, (b_beta[:, None] * b_v).to(dt), input_precision=PRECISION)
            p_u = tl.make_block_ptr(updates + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
            tl.store(p_u, b_u.to(p_u.dtype.element_ty), boundary_check=(0, 1))
    key_base = (i_b * T * H + i_h).to(tl.int64) * K
    for i_k in range(tl.cdiv(K, BK)):
        p_k = tl.make_block_ptr(k + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_w = tl.dot(b_t, ((b_beta * tl.exp(b_gc))[:, None] * b_k).to(dt), input_precision=PRECISION)
        p_w = tl.make_block_ptr(keys_in + chunk * C * K, (C, K), (K, 1), (0, i_k * BK), (C, BK), (1, 0))
        tl.store(p_w, b_w.to(p_w.dtype.element_ty), boundary_check=(0, 1))
        p_ke = tl.make_block_ptr(keys_out + chunk * C * K, (C, K), (K, 1), (0, i_k * BK), (C, BK), (1, 0))
        tl.store(p_ke, (tl.exp(b_last - b_gc)[:, None] * b_k).to(p_ke.dtype.element_ty), boundary_check=(0, 1))
