"""Triton kernels for the gated delta rule's outputs and the state-free half of their backward.

With S_n the state entering chunk n, Delta_n its corrections (kernels/gdn/state_pass.py), Q~ = scale Q and
D the inclusive decay matrix of kernels/gdn/triton_wy.py:

    O_n             = diag(exp(gc)) Q~ S_n + (D o Q~ K^T) Delta_n             gdn_fwd_kernel_output
    dS_n(outputs)   = (diag(exp(gc)) Q~)^T dO_n                               gdn_bwd_kernel_output_terms
    dDelta_n(outputs) = (D o Q~ K^T)^T dO_n = (D^T o K Q~^T) dO_n

The two gradients need no state, so they are formed for all chunks at once before the backward state pass,
which adds them into its recurrence. Products take their operands in the inputs' dtype (16-bit products
with float32 accumulation for 16-bit inputs, float32 at the launch's ``PRECISION`` otherwise); transposed
operands are loaded transposed from memory, and the transposed score matrix is formed directly as K Q~^T.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gated_queries_transposed(b_q_t, b_gc, scale):
    """(diag(exp(gc)) scale Q)^T in float32 from a [BK, C] tile of Q^T: the left factor of a chunk's dS_n(outputs),
    here and in the backward state pass (kernels/gdn/state_pass_triton.py), which casts it to the inputs' dtype."""
    return b_q_t.to(tl.float32) * (tl.exp(b_gc) * scale)[None, :]


@triton.jit
def gdn_fwd_kernel_output(
    q, k, gate_cumsum, states, corrections, output, scale, T, N, first_chunk,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # One program per (value block, chunk, batch * head).
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1) + first_chunk, tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    chunk = i_bh.to(tl.int64) * N + i_n
    o_c = tl.arange(0, C)
    dt = q.dtype.element_ty
    b_gc = tl.load(gate_cumsum + chunk * C + o_c)
    key_base = (i_b * T * H + i_h).to(tl.int64) * K
    b_qs = tl.zeros([C, BV], dtype=tl.float32)
    b_qk = tl.zeros([C, C], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        p_k = tl.make_block_ptr(k + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        p_k_t = tl.make_block_ptr(k + key_base, (K, T), (1, H * K), (i_k * BK, i_n * C), (BK, C), (0, 1))
        p_s = tl.make_block_ptr(states + chunk * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(dt)
        b_k_t = tl.load(p_k_t, boundary_check=(0, 1), padding_option="zero").to(dt)
        b_s = tl.load(p_s, boundary_check=(0, 1), padding_option="zero").to(dt)
        b_qs += tl.dot(b_q, b_s, input_precision=PRECISION)
        b_qk += tl.dot(b_q, b_k_t, input_precision=PRECISION)
    mask = o_c[:, None] >= o_c[None, :]
    b_scores = tl.where(mask, tl.exp(tl.where(mask, b_gc[:, None] - b_gc[None, :], 0.0)) * b_qk, 0.0)
    p_delta = tl.make_block_ptr(corrections + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
    b_delta = tl.load(p_delta, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_o = tl.exp(b_gc)[:, None] * b_qs + tl.dot(b_scores.to(dt), b_delta.to(dt), input_precision=PRECISION)
    value_base = (i_b * T * H + i_h).to(tl.int64) * V
    p_o = tl.make_block_ptr(output + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
    tl.store(p_o, (b_o * scale).to(p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gdn_bwd_kernel_output_terms(
    q, k, do, gate_cumsum, entering_grad, corrections_grad, scale, T, N, first_chunk,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr, STATE_TERMS: tl.constexpr = True,
):
    # One program per (chunk, batch * head): the outputs' gradients of the chunk's entering state [K, V] (unless
    # not STATE_TERMS: the backward state pass then forms them itself) and of its corrections [C, V], float32.
    i_n, i_bh = tl.program_id(0) + first_chunk, tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    chunk = i_bh.to(tl.int64) * N + i_n
    o_c = tl.arange(0, C)
    dt = q.dtype.element_ty
    b_gc = tl.load(gate_cumsum + chunk * C + o_c)
    key_base = (i_b * T * H + i_h).to(tl.int64) * K
    value_base = (i_b * T * H + i_h).to(tl.int64) * V
    b_kq = tl.zeros([C, C], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_q_t = tl.make_block_ptr(q + key_base, (K, T), (1, H * K), (i_k * BK, i_n * C), (BK, C), (0, 1))
        p_k = tl.make_block_ptr(k + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        b_q_t = tl.load(p_q_t, boundary_check=(0, 1), padding_option="zero")
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(dt)
        b_kq += tl.dot(b_k, b_q_t.to(dt), input_precision=PRECISION)
        if STATE_TERMS:
            b_qg_t = gated_queries_transposed(b_q_t, b_gc, scale).to(dt)
            for i_v in range(tl.cdiv(V, BV)):
                p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
                b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
                p_ds = tl.make_block_ptr(
                    entering_grad + chunk * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
                tl.store(p_ds, tl.dot(b_qg_t, b_do.to(dt), input_precision=PRECISION), boundary_check=(0, 1))
    mask = o_c[:, None] <= o_c[None, :]
    b_scores_t = tl.where(mask, tl.exp(tl.where(mask, b_gc[None, :] - b_gc[:, None], 0.0)) * b_kq * scale, 0.0)
    for i_v in range(tl.cdiv(V, BV)):
        p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        p_dd = tl.make_block_ptr(corrections_grad + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
        tl.store(p_dd, tl.dot(b_scores_t.to(dt), b_do.to(dt), input_precision=PRECISION), boundary_check=(0, 1))
