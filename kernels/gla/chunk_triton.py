"""Triton chunked GLA: kernels, host functions and the Triton implementation of chunk_gla.

Forward: gate cumsum (with each chunk's cumulative-gate range) -> per-chunk state updates (parallel over
chunks) -> state scan -> output. Chunks whose cumulative gate spans at most SPAN_LIMIT ("smooth", nearly all
in practice) get their output from one fused kernel that forms the intra-chunk scores as a single matrix
product around a per-chunk reference; the others ("steep") go through the exact 16-token sub-chunk kernels.
Backward: the same recomputation of states, the per-chunk state-gradient updates and the reverse scan, then
for smooth chunks a dv kernel and a dq/dk/dg kernel, for steep chunks sub-chunk scores, dv (with the score
gradients), the intra-chunk dq/dk and a last kernel adding the state terms and forming dg. Every kernel of
one path returns at once on the other path's chunks. kernels/gla/README.md derives every formula.
No kernel feeds a transposed matrix-product accumulator cast to 16 bits into another product (Triton
3.4-3.7.0 miscompiles that on Hopper): transposed operands are loaded transposed from memory, or are gated
inputs transposed in registers, never products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.function import Implementation
from schedlang.kernels.common.triton_gradients import chunk_value_products
from schedlang.kernels.common.triton_scan import (
    chunk_local_cumsum_with_range,
    chunk_state_scan,
    chunk_state_scan_pair,
    new_output,
)

CHUNK = 64
SUB_CHUNK = 16
SPAN_LIMIT = 60.0
"""A chunk is smooth when no key's cumulative gate spans more than this over the chunk; the factors
exp(gc - mid) and exp(mid - gc) then stay within exp(+-30), far inside bfloat16's and float32's range."""
FLOAT16_SPAN_LIMIT = 8.0
"""float16 overflows at 65504: its gated operands keep their factors within exp(+-4)."""

# launch shapes of the smooth-chunk kernels: at 4 warps they spill (benchmarks/kernel_resources.py)
SMOOTH_LAUNCH = dict(num_warps=8, num_stages=2)
SMOOTH_BLOCK_V = 128  # the whole value dimension up to 128: each chunk's scores are formed once
DQKG_BLOCK_K = 32
DQKG_WARPS = 8


def smooth_span_limit(dtype: torch.dtype) -> float:
    """The span limit for inputs of this dtype (read at call time, so tests can move SPAN_LIMIT)."""
    return min(SPAN_LIMIT, FLOAT16_SPAN_LIMIT) if dtype == torch.float16 else SPAN_LIMIT


@triton.jit
def gla_fwd_kernel_chunk_updates(
    x, y, gate_cumsum, chunk_gate, updates, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FROM_CHUNK_END: tl.constexpr,
):
    # FROM_CHUNK_END: U_n = (k * exp(gl - gc))^T v  (state pass); else U_n = scale * (q * exp(gc))^T do (gradient pass)
    i_k, i_v, i_nbh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_n = i_nbh // NT, i_nbh % NT
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    p_xt = tl.make_block_ptr(x + i_b * T * H * K + i_h * K, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
    p_gct = tl.make_block_ptr(
        gate_cumsum + i_b * T * H * K + i_h * K, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1)
    )
    p_y = tl.make_block_ptr(y + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    # [BK, BT]
    b_xt = tl.load(p_xt, boundary_check=(0, 1), padding_option="zero")
    b_gct = tl.load(p_gct, boundary_check=(0, 1), padding_option="zero")
    b_y = tl.load(p_y, boundary_check=(0, 1), padding_option="zero")
    if FROM_CHUNK_END:
        b_gl = tl.load(chunk_gate + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
        b_xt = (b_xt * tl.exp(b_gl[:, None] - b_gct)).to(b_y.dtype)
    else:
        b_xt = (b_xt * tl.exp(b_gct) * scale).to(b_y.dtype)
    # [BK, BV]
    b_update = tl.dot(b_xt, b_y)
    p_update = tl.make_block_ptr(
        updates + i_nbh.to(tl.int64) * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0)
    )
    tl.store(p_update, b_update.to(p_update.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K: tl.constexpr, KP: tl.constexpr):
    """True when no key's cumulative gate spans more than span_limit over chunk i_n: one reference then
    factorises every exp(gc_i - gc_j) of the chunk into two factors within exp(+-span_limit / 2)."""
    o_k = tl.arange(0, KP)
    b_span = tl.load(gate_span + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
    return tl.max(b_span, axis=0) <= span_limit


@triton.jit
def smooth_gated_block(
    q, k, gate_cumsum, gate_mid, base, row_valid, i_n, i_k, i_bh, T, NT,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
):
    """Keys [i_k * BK, ...) of chunk i_n: q, k, gc and the gated q * exp(gc - mid), k * exp(mid - gc),
    zero on padded tokens, in q's dtype."""
    p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
    b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
    o_k = i_k * BK + tl.arange(0, BK)
    b_mid = tl.load(gate_mid + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
    b_qg = tl.where(row_valid[:, None], b_q * tl.exp(b_gc - b_mid[None, :]), 0.0).to(b_q.dtype)
    b_kg = tl.where(row_valid[:, None], b_k * tl.exp(b_mid[None, :] - b_gc), 0.0).to(b_q.dtype)
    return b_q, b_k, b_gc, b_qg, b_kg


@triton.jit
def gla_fwd_kernel_smooth_output(
    q, k, v, gate_cumsum, gate_mid, gate_span, states, output, scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # o = scale * (q * exp(gc)) S_n + (causal A) v with A = scale * (q * exp(gc - mid)) (k * exp(mid - gc))^T.
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if not chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    base = i_b * T * H * K + i_h * K
    o_t = tl.arange(0, BT)
    row_valid = i_n * BT + o_t < T
    state_base = states + (i_bh * NT + i_n).to(tl.int64) * K * V
    b_scores = tl.zeros([BT, BT], dtype=tl.float32)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q, b_k, b_gc, b_qg, b_kg = smooth_gated_block(
            q, k, gate_cumsum, gate_mid, base, row_valid, i_n, i_k, i_bh, T, NT, H, K, BT, BK
        )
        p_h = tl.make_block_ptr(state_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_h = tl.load(p_h, boundary_check=(0, 1))
        # the transpose of a gated input, not of a product's accumulator (see the module docstring)
        b_scores += tl.dot(b_qg, tl.trans(b_kg))
        b_o += tl.dot((b_q * tl.exp(b_gc)).to(b_h.dtype), b_h)
    b_scores = tl.where(o_t[:, None] >= o_t[None, :], b_scores * scale, 0.0)
    p_v = tl.make_block_ptr(v + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
    b_o = b_o * scale + tl.dot(b_scores.to(b_v.dtype), b_v)
    p_o = tl.make_block_ptr(output + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gla_bwd_kernel_smooth_dv(
    q, k, do, gate_cumsum, chunk_gate, gate_mid, gate_span, state_grads, dv, scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # dv = (causal A)^T do + (k * exp(gl - gc)) dS_leaving; A^T is formed directly as
    # (k * exp(mid - gc)) (q * exp(gc - mid))^T, never by transposing a product.
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if not chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    base = i_b * T * H * K + i_h * K
    o_t = tl.arange(0, BT)
    row_valid = i_n * BT + o_t < T
    grad_base = state_grads + (i_bh * NT + i_n).to(tl.int64) * K * V
    # [BT(j), BT(i)] = A[i, j]
    b_scores_t = tl.zeros([BT, BT], dtype=tl.float32)
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q, b_k, b_gc, b_qg, b_kg = smooth_gated_block(
            q, k, gate_cumsum, gate_mid, base, row_valid, i_n, i_k, i_bh, T, NT, H, K, BT, BK
        )
        p_dh = tl.make_block_ptr(grad_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_dh = tl.load(p_dh, boundary_check=(0, 1))
        o_k = i_k * BK + tl.arange(0, BK)
        b_gl = tl.load(chunk_gate + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
        b_scores_t += tl.dot(b_kg, tl.trans(b_qg))
        b_kd = tl.where(row_valid[:, None], b_k * tl.exp(b_gl[None, :] - b_gc), 0.0).to(b_dh.dtype)
        b_dv += tl.dot(b_kd, b_dh)
    b_scores_t = tl.where(o_t[None, :] >= o_t[:, None], b_scores_t * scale, 0.0)
    p_do = tl.make_block_ptr(do + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    b_dv += tl.dot(b_scores_t.to(b_do.dtype), b_do)
    p_dv = tl.make_block_ptr(dv + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_dv, b_dv.to(p_dv.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gla_bwd_kernel_smooth_dqkg(
    q, k, v, do, gate_cumsum, chunk_gate, gate_mid, gate_span, states, state_grads, dq, dk, dg,
    scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # dA = scale * do v^T (causal), and dA^T formed directly as scale * v do^T;
    # dq = scale * exp(gc) (do S_n^T) + exp(gc - mid) (dA (k * exp(mid - gc)));
    # dk = exp(gl - gc) (v dS^T) + exp(mid - gc) (dA^T (q * exp(gc - mid)));
    # dg = reverse-cumsum_in_chunk(q dq - k dk) + sum_v(S_{n+1} dS_{n+1}), as in gla_bwd_kernel_inter.
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if not chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    o_t = tl.arange(0, BT)
    row_valid = i_n * BT + o_t < T
    chunk_offset = (i_bh * NT + i_n).to(tl.int64) * K * V
    value_base = i_b * T * H * V + i_h * V
    b_dscores, b_dscores_t, b_dq, b_dk, b_boundary = chunk_value_products(
        do, v, states, state_grads, value_base, chunk_offset, i_n, i_k * BK, T, H, K, V, BT, BK, BV
    )
    b_dscores = tl.where(o_t[:, None] >= o_t[None, :], b_dscores * scale, 0.0)
    b_dscores_t = tl.where(o_t[None, :] >= o_t[:, None], b_dscores_t * scale, 0.0)
    base = i_b * T * H * K + i_h * K
    o_k = i_k * BK + tl.arange(0, BK)
    p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
    b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
    gate_offset = (i_bh * NT + i_n) * K + o_k
    b_mid = tl.load(gate_mid + gate_offset, mask=o_k < K, other=0.0)
    b_gl = tl.load(chunk_gate + gate_offset, mask=o_k < K, other=0.0)
    valid = row_valid[:, None]
    b_up = tl.where(valid, tl.exp(b_gc - b_mid[None, :]), 0.0)
    b_down = tl.where(valid, tl.exp(b_mid[None, :] - b_gc), 0.0)
    b_dq_intra = tl.dot(b_dscores.to(b_k.dtype), (b_k * b_down).to(b_k.dtype)) * b_up
    b_dk_intra = tl.dot(b_dscores_t.to(b_q.dtype), (b_q * b_up).to(b_q.dtype)) * b_down
    b_q = b_q.to(tl.float32)
    b_k = b_k.to(tl.float32)
    b_dq = b_dq_intra + tl.where(valid, b_dq * scale * tl.exp(b_gc), 0.0)
    b_dk_state = tl.where(valid, b_dk * tl.exp(b_gl[None, :] - b_gc), 0.0)
    b_dk = b_dk_intra + b_dk_state
    b_boundary = b_boundary * tl.exp(b_gl) + tl.sum(b_k * b_dk_state, axis=0)
    b_terms = b_q * b_dq - b_k * b_dk
    b_dg = tl.sum(b_terms, axis=0)[None, :] - tl.cumsum(b_terms, axis=0) + b_terms + b_boundary[None, :]
    p_dq = tl.make_block_ptr(dq + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dk = tl.make_block_ptr(dk + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dg = tl.make_block_ptr(dg + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    tl.store(p_dq, b_dq.to(p_dq.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dk, b_dk.to(p_dk.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dg, b_dg.to(p_dg.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _steep_scores_rows(
    q, k, gate_cumsum, scores, scale, T, i_n, i_x, i_bh,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
):
    i_b, i_h = i_bh // H, i_bh % H
    row0 = i_n * BT + i_x * BC
    if row0 < T:
        base = i_b * T * H * K + i_h * K
        score_base = scores + i_b * T * H * BT + i_h * BT
        o_i = tl.arange(0, BC)
        i_y = 0
        while i_y < i_x:
            b_block = tl.zeros([BC, BC], dtype=tl.float32)
            for i_k in range(tl.cdiv(K, BK)):
                o_k = i_k * BK + tl.arange(0, BK)
                p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
                p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
                p_kt = tl.make_block_ptr(k + base, (K, T), (1, H * K), (i_k * BK, i_n * BT + i_y * BC), (BK, BC), (0, 1))
                p_gct = tl.make_block_ptr(
                    gate_cumsum + base, (K, T), (1, H * K), (i_k * BK, i_n * BT + i_y * BC), (BK, BC), (0, 1)
                )
                # reference: the cumulative gate at the first row of sub-chunk x
                b_ref = tl.load(gate_cumsum + base + row0 * H * K + o_k, mask=o_k < K, other=0.0)
                b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
                b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
                b_kt = tl.load(p_kt, boundary_check=(0, 1), padding_option="zero")
                b_gct = tl.load(p_gct, boundary_check=(0, 1), padding_option="zero")
                row_valid = (row0 + o_i < T)[:, None]
                b_qg = tl.where(row_valid, b_q * tl.exp(b_gc - b_ref[None, :]), 0.0).to(b_q.dtype)
                b_kg = (b_kt * tl.exp(b_ref[:, None] - b_gct)).to(b_q.dtype)
                b_block += tl.dot(b_qg, b_kg)
            p_s = tl.make_block_ptr(score_base, (T, BT), (H * BT, 1), (row0, i_y * BC), (BC, BC), (1, 0))
            tl.store(p_s, b_block * scale, boundary_check=(0, 1))
            i_y += 1
        b_diag = tl.zeros([BC, BC], dtype=tl.float32)
        causal = (o_i[:, None] >= o_i[None, :])[:, :, None]
        for i_k in range(tl.cdiv(K, BK)):
            p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
            p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
            p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
            b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
            # [BC(i), BC(j), BK], exact: exp(gc_i - gc_j) <= 1 wherever j <= i
            exponent = tl.where(causal, b_gc[:, None, :] - b_gc[None, :, :], float("-inf"))
            b_diag += tl.sum(b_q[:, None, :] * b_k[None, :, :] * tl.exp(exponent), axis=2)
        p_s = tl.make_block_ptr(score_base, (T, BT), (H * BT, 1), (row0, i_x * BC), (BC, BC), (1, 0))
        tl.store(p_s, b_diag * scale, boundary_check=(0, 1))


@triton.jit
def gla_fwd_kernel_intra_scores(
    q, k, gate_cumsum, gate_span, scores, scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, NC: tl.constexpr,
    KP: tl.constexpr,
):
    # One program per steep chunk: the scores row strip of each sub-chunk x in turn, blocks y <= x.
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    if chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    for i_x in range(NC):
        _steep_scores_rows(q, k, gate_cumsum, scores, scale, T, i_n, i_x, i_bh, H, K, BT, BC, BK)


@triton.jit
def gla_fwd_kernel_output(
    q, v, gate_cumsum, gate_span, states, scores, output, scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # The output of a steep chunk from its sub-chunk scores.
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    state_base = states + (i_bh * NT + i_n).to(tl.int64) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_gc = tl.make_block_ptr(
            gate_cumsum + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0)
        )
        p_h = tl.make_block_ptr(state_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
        b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
        b_h = tl.load(p_h, boundary_check=(0, 1))
        b_o += tl.dot((b_q * tl.exp(b_gc)).to(b_h.dtype), b_h)
    b_o *= scale
    o_t = tl.arange(0, BT)
    p_s = tl.make_block_ptr(scores + i_b * T * H * BT + i_h * BT, (T, BT), (H * BT, 1), (i_n * BT, 0), (BT, BT), (1, 0))
    p_v = tl.make_block_ptr(v + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_s = tl.load(p_s, boundary_check=(0, 1), padding_option="zero")
    b_s = tl.where(o_t[:, None] >= o_t[None, :], b_s, 0.0)
    b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
    b_o += tl.dot(b_s.to(b_v.dtype), b_v)
    p_o = tl.make_block_ptr(output + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gla_bwd_kernel_dv(
    k, v, do, gate_cumsum, chunk_gate, gate_span, scores, state_grads, dv, score_grads, scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # Steep chunks: dv = scores^T do + (k * exp(gl - gc)) dS_leaving; the program with i_v == 0 also writes
    # score_grads = scale * do v^T (causal), used by the intra-chunk dq/dk.
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    o_t = tl.arange(0, BT)
    causal = o_t[:, None] >= o_t[None, :]
    # [BT(j), BT(i)] = scores[i, j]
    p_st = tl.make_block_ptr(scores + i_b * T * H * BT + i_h * BT, (BT, T), (1, H * BT), (0, i_n * BT), (BT, BT), (0, 1))
    b_st = tl.load(p_st, boundary_check=(0, 1), padding_option="zero")
    b_st = tl.where(o_t[None, :] >= o_t[:, None], b_st, 0.0)
    p_do = tl.make_block_ptr(do + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    b_dv = tl.dot(b_st.to(b_do.dtype), b_do)
    grad_base = state_grads + (i_bh * NT + i_n).to(tl.int64) * K * V
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        p_k = tl.make_block_ptr(k + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_gc = tl.make_block_ptr(
            gate_cumsum + i_b * T * H * K + i_h * K, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0)
        )
        p_dh = tl.make_block_ptr(grad_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
        b_gl = tl.load(chunk_gate + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
        b_dh = tl.load(p_dh, boundary_check=(0, 1))
        b_dv += tl.dot((b_k * tl.exp(b_gl[None, :] - b_gc)).to(b_dh.dtype), b_dh)
    p_dv = tl.make_block_ptr(dv + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_dv, b_dv.to(p_dv.dtype.element_ty), boundary_check=(0, 1))
    if i_v == 0:
        b_ds = tl.zeros([BT, BT], dtype=tl.float32)
        for i_v2 in range(tl.cdiv(V, BV)):
            p_do2 = tl.make_block_ptr(
                do + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v2 * BV), (BT, BV), (1, 0)
            )
            p_vt = tl.make_block_ptr(v + i_b * T * H * V + i_h * V, (V, T), (1, H * V), (i_v2 * BV, i_n * BT), (BV, BT), (0, 1))
            b_do2 = tl.load(p_do2, boundary_check=(0, 1), padding_option="zero")
            b_vt = tl.load(p_vt, boundary_check=(0, 1), padding_option="zero")
            b_ds += tl.dot(b_do2, b_vt)
        b_ds = tl.where(causal, b_ds * scale, 0.0)
        p_ds = tl.make_block_ptr(
            score_grads + i_b * T * H * BT + i_h * BT, (T, BT), (H * BT, 1), (i_n * BT, 0), (BT, BT), (1, 0)
        )
        tl.store(p_ds, b_ds, boundary_check=(0, 1))


@triton.jit
def _steep_intra_gradient_rows(
    q, k, gate_cumsum, score_grads, dq_intra, dk_intra, T, i_k, i_n, i_x, i_bh,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, NC: tl.constexpr,
):
    i_b, i_h = i_bh // H, i_bh % H
    row0 = i_n * BT + i_x * BC
    if row0 < T:
        base = i_b * T * H * K + i_h * K
        grad_base = score_grads + i_b * T * H * BT + i_h * BT
        o_i = tl.arange(0, BC)
        o_k = i_k * BK + tl.arange(0, BK)
        key_ok = o_k < K
        p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
        b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
        b_first = tl.load(gate_cumsum + base + row0 * H * K + o_k, mask=key_ok, other=0.0)
        last_row = tl.minimum(row0 + BC, T) - 1
        b_last = tl.load(gate_cumsum + base + last_row * H * K + o_k, mask=key_ok, other=0.0)

        b_dq = tl.zeros([BC, BK], dtype=tl.float32)
        i_y = 0
        while i_y < i_x:
            p_ds = tl.make_block_ptr(grad_base, (T, BT), (H * BT, 1), (row0, i_y * BC), (BC, BC), (1, 0))
            p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT + i_y * BC, i_k * BK), (BC, BK), (1, 0))
            p_gy = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT + i_y * BC, i_k * BK), (BC, BK), (1, 0))
            b_ds = tl.load(p_ds, boundary_check=(0, 1), padding_option="zero")
            b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
            b_gy = tl.load(p_gy, boundary_check=(0, 1), padding_option="zero")
            b_kg = (b_k * tl.exp(b_first[None, :] - b_gy)).to(b_k.dtype)
            b_dq += tl.dot(b_ds.to(b_k.dtype), b_kg)
            i_y += 1
        b_dq *= tl.exp(b_gc - b_first[None, :])
        # the diagonal sub-chunk, exactly: [BC(i), BC(j), BK] with exp(gc_i - gc_j) <= 1 wherever j <= i
        p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
        p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
        p_dsd = tl.make_block_ptr(grad_base, (T, BT), (H * BT, 1), (row0, i_x * BC), (BC, BC), (1, 0))
        b_kx = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_qx = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_dsd = tl.load(p_dsd, boundary_check=(0, 1), padding_option="zero")
        # a padded row i carries gc_i = 0, so exp(gc_i - gc_j) would overflow under strong decay: mask it out
        causal = ((o_i[:, None] >= o_i[None, :]) & (row0 + o_i < T)[:, None])[:, :, None]
        b_decay = tl.exp(tl.where(causal, b_gc[:, None, :] - b_gc[None, :, :], float("-inf")))
        b_dq += tl.sum(b_dsd[:, :, None] * b_kx[None, :, :] * b_decay, axis=1)

        b_dk = tl.zeros([BC, BK], dtype=tl.float32)
        n_valid = tl.minimum(NC, tl.cdiv(T - i_n * BT, BC))
        i_z = i_x + 1
        while i_z < n_valid:
            # [BC(j in x), BC(i in z)] = dS[i, j]
            p_dst = tl.make_block_ptr(grad_base, (BT, T), (1, H * BT), (i_x * BC, i_n * BT + i_z * BC), (BC, BC), (0, 1))
            p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT + i_z * BC, i_k * BK), (BC, BK), (1, 0))
            p_gz = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT + i_z * BC, i_k * BK), (BC, BK), (1, 0))
            b_dst = tl.load(p_dst, boundary_check=(0, 1), padding_option="zero")
            b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
            b_gz = tl.load(p_gz, boundary_check=(0, 1), padding_option="zero")
            z_valid = (i_n * BT + i_z * BC + o_i < T)[:, None]
            b_qg = tl.where(z_valid, b_q * tl.exp(b_gz - b_last[None, :]), 0.0).to(b_q.dtype)
            b_dk += tl.dot(b_dst.to(b_q.dtype), b_qg)
            i_z += 1
        b_dk *= tl.exp(b_last[None, :] - b_gc)
        b_dk += tl.sum(b_dsd[:, :, None] * b_qx[:, None, :] * b_decay, axis=0)

        p_dq = tl.make_block_ptr(dq_intra + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
        p_dk = tl.make_block_ptr(dk_intra + base, (T, K), (H * K, 1), (row0, i_k * BK), (BC, BK), (1, 0))
        tl.store(p_dq, b_dq, boundary_check=(0, 1))
        tl.store(p_dk, b_dk, boundary_check=(0, 1))


@triton.jit
def gla_bwd_kernel_intra(
    q, k, gate_cumsum, gate_span, score_grads, dq_intra, dk_intra, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, NC: tl.constexpr,
    KP: tl.constexpr,
):
    # One program per (key block, steep chunk), sub-chunk after sub-chunk:
    # dq_i = sum_{j<=i} dS_ij k_j exp(gc_i - gc_j);  dk_j = sum_{i>=j} dS_ij q_i exp(gc_i - gc_j), for the
    # rows of sub-chunk x and key columns [i_k * BK, (i_k + 1) * BK).
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    for i_x in range(NC):
        _steep_intra_gradient_rows(
            q, k, gate_cumsum, score_grads, dq_intra, dk_intra, T, i_k, i_n, i_x, i_bh, H, K, BT, BC, BK, NC
        )


@triton.jit
def gla_bwd_kernel_inter(
    q, k, v, do, gate_cumsum, chunk_gate, gate_span, states, state_grads, dq_intra, dk_intra, dq, dk, dg,
    scale, span_limit, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr,
):
    # Steep chunks: adds the state terms to dq/dk and forms
    # dg = reverse-cumsum_in_chunk(q dq - k dk) + sum_v(S_{n+1} dS_{n+1}).
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K, KP):
        return
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    chunk_offset = (i_bh * NT + i_n).to(tl.int64) * K * V
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_boundary = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_do = tl.make_block_ptr(do + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        p_v = tl.make_block_ptr(v + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        # [BV, BK] views of the [K, V] state and state gradient
        p_ht = tl.make_block_ptr(states + chunk_offset, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
        p_dht = tl.make_block_ptr(state_grads + chunk_offset, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
        b_ht = tl.load(p_ht, boundary_check=(0, 1))
        b_dht = tl.load(p_dht, boundary_check=(0, 1))
        b_dq += tl.dot(b_do.to(b_ht.dtype), b_ht)
        b_dk += tl.dot(b_v.to(b_dht.dtype), b_dht)
        b_boundary += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), axis=0)
    base = i_b * T * H * K + i_h * K
    p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dqi = tl.make_block_ptr(dq_intra + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dki = tl.make_block_ptr(dk_intra + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
    b_gl = tl.load(chunk_gate + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
    b_dq = tl.load(p_dqi, boundary_check=(0, 1), padding_option="zero") + b_dq * scale * tl.exp(b_gc)
    b_dk_state = b_dk * tl.exp(b_gl[None, :] - b_gc)
    b_dk = tl.load(p_dki, boundary_check=(0, 1), padding_option="zero") + b_dk_state
    b_boundary = b_boundary * tl.exp(b_gl) + tl.sum(b_k * b_dk_state, axis=0)
    b_terms = b_q * b_dq - b_k * b_dk
    b_dg = tl.sum(b_terms, axis=0)[None, :] - tl.cumsum(b_terms, axis=0) + b_terms + b_boundary[None, :]
    p_dq = tl.make_block_ptr(dq + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dk = tl.make_block_ptr(dk + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dg = tl.make_block_ptr(dg + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    tl.store(p_dq, b_dq.to(p_dq.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dk, b_dk.to(p_dk.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dg, b_dg.to(p_dg.dtype.element_ty), boundary_check=(0, 1))


def _blocks(dim: int, largest: int) -> int:
    return max(16, min(largest, triton.next_power_of_2(dim)))


def _states_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float32, torch.float64) else dtype


def chunk_updates(x, y, gate_cumsum, chunk_gate, scale: float, from_chunk_end: bool) -> torch.Tensor:
    """Per-chunk state contributions [B, H, NT, K, V] in the states' dtype, in parallel over chunks."""
    batch, length, heads, key_dim = x.shape
    value_dim = y.shape[-1]
    n_chunks = triton.cdiv(length, CHUNK)
    # in the states' dtype: bfloat16 for 16-bit inputs halves the traffic of the pass; the scan adds in float32
    updates = new_output((batch, heads, n_chunks, key_dim, value_dim), _states_dtype(x.dtype), x.device)
    block_k, block_v = _blocks(key_dim, 64), _blocks(value_dim, 128)
    grid = (triton.cdiv(key_dim, block_k), triton.cdiv(value_dim, block_v), n_chunks * batch * heads)
    gla_fwd_kernel_chunk_updates[grid](
        x, y, gate_cumsum, chunk_gate, updates, scale, length, n_chunks,
        H=heads, K=key_dim, V=value_dim, BT=CHUNK, BK=block_k, BV=block_v, FROM_CHUNK_END=from_chunk_end,
    )
    return updates


@dataclass(frozen=True)
class ChunkGates:
    """What the kernels read of the gates: the chunk-local cumsum [B, T, H, K], and per chunk and key
    ([B, H, NT, K]) the total, the midpoint and the width of the cumulative gate's range."""

    cumsum: torch.Tensor
    total: torch.Tensor
    mid: torch.Tensor
    span: torch.Tensor


def chunk_gates(g: torch.Tensor) -> ChunkGates:
    return ChunkGates(*chunk_local_cumsum_with_range(g, CHUNK))


def _launch_args(q, v):
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    return dict(
        T=length, NT=triton.cdiv(length, CHUNK), H=heads, K=key_dim, V=value_dim, BT=CHUNK,
        BK=_blocks(key_dim, 64), BV=_blocks(value_dim, 64), KP=triton.next_power_of_2(key_dim),
    )


def intra_scores(q, k, gates: ChunkGates, scale: float, span_limit: float) -> torch.Tensor:
    """Scaled causal intra-chunk scores [B, T, H, CHUNK] float32 of the steep chunks (elsewhere unwritten)."""
    batch, length, heads, key_dim = q.shape
    n_chunks = triton.cdiv(length, CHUNK)
    scores = new_output((batch, length, heads, CHUNK), torch.float32, q.device)
    n_sub = CHUNK // SUB_CHUNK
    gla_fwd_kernel_intra_scores[(n_chunks, batch * heads)](
        q, k, gates.cumsum, gates.span, scores, scale, span_limit, length, n_chunks,
        H=heads, K=key_dim, BT=CHUNK, BC=SUB_CHUNK, BK=_blocks(key_dim, 32), NC=n_sub,
        KP=triton.next_power_of_2(key_dim),
    )
    return scores


def _contiguous(*tensors):
    return [tensor.contiguous() for tensor in tensors]


def _states(k, v, gates: ChunkGates, initial_state):
    updates = chunk_updates(k, v, gates.cumsum, gates.total, 1.0, from_chunk_end=True)
    return chunk_state_scan(updates, gates.total, initial_state, _states_dtype(k.dtype), reverse=False)


def forward(q, k, v, g, scale, initial_state):
    q, k, v, g = _contiguous(q, k, v, g)
    args = _launch_args(q, v)
    batch, _, heads, _ = q.shape
    span_limit = smooth_span_limit(q.dtype)
    gates = chunk_gates(g)
    states, final_state = _states(k, v, gates, initial_state)
    output = new_output(v.shape, v.dtype, v.device)
    grid = (triton.cdiv(args["V"], args["BV"]), args["NT"], batch * heads)
    smooth_args = dict(args, BV=_blocks(args["V"], SMOOTH_BLOCK_V))
    gla_fwd_kernel_smooth_output[(triton.cdiv(args["V"], smooth_args["BV"]), args["NT"], batch * heads)](
        q, k, v, gates.cumsum, gates.mid, gates.span, states, output, scale, span_limit, **smooth_args,
        **SMOOTH_LAUNCH,
    )
    scores = intra_scores(q, k, gates, scale, span_limit)
    gla_fwd_kernel_output[grid](
        q, v, gates.cumsum, gates.span, states, scores, output, scale, span_limit, **args
    )
    return output, final_state


def backward(q, k, v, g, scale, initial_state, do, final_state_grad):
    q, k, v, g, do = _contiguous(q, k, v, g, do)
    args = _launch_args(q, v)
    batch, length, heads, key_dim = q.shape
    n_chunks = args["NT"]
    span_limit = smooth_span_limit(q.dtype)
    gates = chunk_gates(g)
    updates = chunk_updates(k, v, gates.cumsum, gates.total, 1.0, from_chunk_end=True)
    grad_updates = chunk_updates(q, do, gates.cumsum, gates.total, scale, from_chunk_end=False)
    states, state_grads, initial_grad = chunk_state_scan_pair(
        updates, grad_updates, gates.total, initial_state, final_state_grad, _states_dtype(k.dtype)
    )
    dv = new_output(v.shape, v.dtype, v.device)
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, k.dtype, k.device)
    dg = new_output(g.shape, torch.float32, g.device)
    grid_v = (triton.cdiv(args["V"], args["BV"]), n_chunks, batch * heads)
    grid_k = (triton.cdiv(key_dim, args["BK"]), n_chunks, batch * heads)
    # smooth chunks: two fused kernels
    smooth_args = dict(args, BV=_blocks(args["V"], SMOOTH_BLOCK_V))
    gla_bwd_kernel_smooth_dv[(triton.cdiv(args["V"], smooth_args["BV"]), n_chunks, batch * heads)](
        q, k, do, gates.cumsum, gates.total, gates.mid, gates.span, state_grads, dv, scale, span_limit,
        **smooth_args, **SMOOTH_LAUNCH,
    )
    dqkg_args = dict(args, BK=_blocks(key_dim, DQKG_BLOCK_K))
    gla_bwd_kernel_smooth_dqkg[(triton.cdiv(key_dim, dqkg_args["BK"]), n_chunks, batch * heads)](
        q, k, v, do, gates.cumsum, gates.total, gates.mid, gates.span, states, state_grads, dq, dk, dg,
        scale, span_limit, num_warps=DQKG_WARPS, **dqkg_args,
    )
    # steep chunks: sub-chunk scores, then dv, the intra-chunk dq/dk and the state terms
    scores = intra_scores(q, k, gates, scale, span_limit)
    score_grads = new_output((batch, length, heads, CHUNK), torch.float32, q.device)
    gla_bwd_kernel_dv[grid_v](
        k, v, do, gates.cumsum, gates.total, gates.span, scores, state_grads, dv, score_grads, scale, span_limit,
        **args,
    )
    dq_intra = new_output(q.shape, torch.float32, q.device)
    dk_intra = new_output(q.shape, torch.float32, q.device)
    n_sub = CHUNK // SUB_CHUNK
    block_intra = _blocks(key_dim, 32)
    gla_bwd_kernel_intra[(triton.cdiv(key_dim, block_intra), n_chunks, batch * heads)](
        q, k, gates.cumsum, gates.span, score_grads, dq_intra, dk_intra, span_limit, length, n_chunks,
        H=heads, K=key_dim, BT=CHUNK, BC=SUB_CHUNK, BK=block_intra, NC=n_sub, KP=args["KP"],
    )
    gla_bwd_kernel_inter[grid_k](
        q, k, v, do, gates.cumsum, gates.total, gates.span, states, state_grads, dq_intra, dk_intra, dq, dk, dg,
        scale, span_limit, **args,
    )
    return dq, dk, dv, dg, initial_grad


TRITON_IMPLEMENTATION = Implementation("triton", forward, backward)
