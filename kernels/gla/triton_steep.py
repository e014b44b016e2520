"""Triton kernels for GLA's steep chunks: the exact 16-token sub-chunk split (kernels/gla/README.md).

Used where some key's cumulative gate spans more than the span limit over a chunk. Each kernel runs one
program per group of CG chunks of the flattened (batch * head, chunk) index (grid axis 0) and key or value
block (axis 1): a group of smooth chunks (kernels/gla/triton_smooth.py) costs its program one load of the spans,
and a group with steep chunks walks them. Every transposed operand is loaded transposed from memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

from schedlang.kernels.common.triton_gradients import chunk_state_products
from schedlang.kernels.gla.triton_shared import chunk_is_steep, group_has_steep_chunk, store_key_gradients


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
    q, k, gate_cumsum, gate_span, scores, scale, span_limit, T, NT, n_all,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, NC: tl.constexpr,
    KP: tl.constexpr, CG: tl.constexpr,
):
    # One program per steep chunk: the scores row strip of each sub-chunk x in turn, blocks y <= x.
    i_group = tl.program_id(0)
    if group_has_steep_chunk(gate_span, span_limit, i_group, n_all, K, KP, CG):
        for i_c in range(CG):
            if chunk_is_steep(gate_span, span_limit, i_group * CG + i_c, n_all, K, KP):
                i_n, i_bh = (i_group * CG + i_c) % NT, (i_group * CG + i_c) // NT
                for i_x in range(NC):
                    _steep_scores_rows(q, k, gate_cumsum, scores, scale, T, i_n, i_x, i_bh, H, K, BT, BC, BK)


@triton.jit
def gla_fwd_kernel_output(
    q, v, gate_cumsum, gate_span, states, scores, output, scale, span_limit, T, NT, n_all,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr, CG: tl.constexpr,
):
    # The output of a steep chunk from its sub-chunk scores.
    i_group, i_v = tl.program_id(0), tl.program_id(1)
    if group_has_steep_chunk(gate_span, span_limit, i_group, n_all, K, KP, CG):
        for i_c in range(CG):
            if chunk_is_steep(gate_span, span_limit, i_group * CG + i_c, n_all, K, KP):
                i_n, i_bh = (i_group * CG + i_c) % NT, (i_group * CG + i_c) // NT
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
    k, v, do, gate_cumsum, chunk_gate, gate_span, scores, state_grads, dv, score_grads, scale, span_limit, T, NT, n_all,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr, CG: tl.constexpr,
):
    # Steep chunks: dv = scores^T do + (k * exp(gl - gc)) dS_leaving; the program with i_v == 0 also writes
    # score_grads = scale * do v^T (causal), used by the intra-chunk dq/dk.
    i_group, i_v = tl.program_id(0), tl.program_id(1)
    if group_has_steep_chunk(gate_span, span_limit, i_group, n_all, K, KP, CG):
        for i_c in range(CG):
            if chunk_is_steep(gate_span, span_limit, i_group * CG + i_c, n_all, K, KP):
                i_n, i_bh = (i_group * CG + i_c) % NT, (i_group * CG + i_c) // NT
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
    q, k, gate_cumsum, gate_span, score_grads, dq_intra, dk_intra, span_limit, T, NT, n_all,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, NC: tl.constexpr,
    KP: tl.constexpr, CG: tl.constexpr,
):
    # One program per (key block, steep chunk), sub-chunk after sub-chunk:
    # dq_i = sum_{j<=i} dS_ij k_j exp(gc_i - gc_j);  dk_j = sum_{i>=j} dS_ij q_i exp(gc_i - gc_j), for the
    # rows of sub-chunk x and key columns [i_k * BK, (i_k + 1) * BK).
    i_group, i_k = tl.program_id(0), tl.program_id(1)
    if group_has_steep_chunk(gate_span, span_limit, i_group, n_all, K, KP, CG):
        for i_c in range(CG):
            if chunk_is_steep(gate_span, span_limit, i_group * CG + i_c, n_all, K, KP):
                i_n, i_bh = (i_group * CG + i_c) % NT, (i_group * CG + i_c) // NT
                for i_x in range(NC):
                    _steep_intra_gradient_rows(
                        q, k, gate_cumsum, score_grads, dq_intra, dk_intra, T, i_k, i_n, i_x, i_bh, H, K, BT, BC, BK, NC
                    )


@triton.jit
def gla_bwd_kernel_inter(
    q, k, v, do, gate_cumsum, chunk_gate, gate_span, states, state_grads, dq_intra, dk_intra, dq, dk, dg,
    scale, span_limit, T, NT, n_all,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KP: tl.constexpr, CG: tl.constexpr,
):
    # Steep chunks: adds the state terms to dq/dk and forms
    # dg = reverse-cumsum_in_chunk(q dq - k dk) + sum_v(S_{n+1} dS_{n+1}).
    i_group, i_k = tl.program_id(0), tl.program_id(1)
    if group_has_steep_chunk(gate_span, span_limit, i_group, n_all, K, KP, CG):
        for i_c in range(CG):
            if chunk_is_steep(gate_span, span_limit, i_group * CG + i_c, n_all, K, KP):
                i_n, i_bh = (i_group * CG + i_c) % NT, (i_group * CG + i_c) // NT
                i_b, i_h = i_bh // H, i_bh % H
                o_k = i_k * BK + tl.arange(0, BK)
                chunk_offset = (i_bh * NT + i_n).to(tl.int64) * K * V
                b_dq, b_dk, b_boundary = chunk_state_products(
                    do, v, states, state_grads, i_b * T * H * V + i_h * V, chunk_offset, i_n, i_k * BK, T, H, K, V, BT, BK, BV,
                    "tf32",  # GLA's float32 products: plain tf32 (its GPU tests' 5e-3)
                )
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
                store_key_gradients(b_q, b_k, b_dq, b_dk, b_dk_state, b_boundary, b_gl, dq, dk, dg, base, i_n, i_k, T, H, K, BT, BK)
