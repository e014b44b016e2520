"""The gated delta rule's per-chunk backward after the backward state pass: dq, dk, dv, dbeta and dg.

One program per (chunk, batch * head) has, besides the inputs, the chunk's entering state S, the gradient
G of its leaving state, its corrections Delta and their total gradient dDelta (kernels/gdn/state_pass.py),
T = (I + A)^-1 and gc. kernels/gdn/README.md ("Backward") derives the terms; in order:

1. over value blocks: dv = beta o T^T dDelta, the dbeta term of V, dT = dDelta (beta V)^T and
   P = dO Delta^T;
2. over key blocks: dq (complete), and into dk, dbeta and dgc the terms of the outputs, of W (dW = -dDelta S^T),
   of KE (dKE = Delta G^T) and of the chunk decay (<S, G>); dT += dW (beta exp(gc) K)^T;
3. dA = -strictly-lower(T^T dT T^T), then over key blocks the terms of A = beta D o K K^T into dk (added to
   what step 2 stored), dbeta and dgc;
4. dg = the chunk's reverse cumsum of dgc.

dk passes through its float32 output between steps 2 and 3, and D o P and Z = beta o dA o D through the
chunk's [C, C] float32 slot of ``scratch``, each behind a barrier, so that their transposes are loaded
transposed and no register tile is ever transposed. Products take float32 operands at the launch's
``PRECISION`` (16-bit operands give wrong gradients on an H200 with Triton 3.6, though right ones in the
interpreter). The split layout's key-block kernel is the exception its launch knobs allow: the value loop's
tiles as stored and one register transpose, both checked on the H200 (kernels/gdn/README.md, "Precision").
"""

from __future__ import annotations

import triton
import triton.language as tl

from schedlang.kernels.gdn.triton_wy import decay_matrix


@triton.jit
def _chunk_prelude(
    beta, gate_cumsum, i_n, i_bh, T, N, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
):
    """Where a backward program of chunk ``i_n`` and batch * head ``i_bh`` reads: (the chunk's index in the
    [B * H * N] per-chunk tensors, arange(C), its tokens [C], their offsets in [B, T, H] tensors, beta [C]
    float32 and zero past T, gc [C], and the (batch, head)'s bases in [B, T, H, K] and [B, T, H, V] tensors)."""
    i_b, i_h = i_bh // H, i_bh % H
    chunk = i_bh.to(tl.int64) * N + i_n
    o_c = tl.arange(0, C)
    token = i_n * C + o_c
    gate_offset = (i_b * T + token).to(tl.int64) * H + i_h
    b_beta = tl.load(beta + gate_offset, mask=token < T, other=0.0).to(tl.float32)
    b_gc = tl.load(gate_cumsum + chunk * C + o_c)
    key_base = (i_b * T * H + i_h).to(tl.int64) * K
    value_base = (i_b * T * H + i_h).to(tl.int64) * V
    return chunk, o_c, token, gate_offset, b_beta, b_gc, key_base, value_base


@triton.jit
def _solve_terms(
    k, dk, b_t_t, b_dt, b_beta, b_gc, b_dbeta, b_dgc, scratch_base, key_base, i_n, T,
    H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
):
    """Step 3, the terms of the solve A = beta D o K K^T: from dT (float32 [C, C]) and T^T, dA = -strictly-lower(
    T^T dT T^T); Z = beta o dA o D passes through the chunk's ``scratch_base`` slot so that Z^T is loaded
    transposed; each key block's terms are added into dk (read back from its float32 output). Returns (dbeta,
    dgc) with the terms added. The caller orders any earlier use of the scratch slot before this with a barrier."""
    o_c = tl.arange(0, C)
    b_da = -tl.dot(tl.dot(b_t_t, b_dt, input_precision=PRECISION), b_t_t, input_precision=PRECISION)
    b_dad = tl.where(o_c[:, None] > o_c[None, :], b_da, 0.0) * decay_matrix(b_gc, True, C)
    tl.store(scratch_base + o_c[:, None] * C + o_c[None, :], b_beta[:, None] * b_dad)
    tl.debug_barrier()
    b_z_t = tl.load(scratch_base + o_c[None, :] * C + o_c[:, None])
    for i_k in range(tl.cdiv(K, BK)):
        p_k = tl.make_block_ptr(k + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_row = tl.dot(b_dad, b_k, input_precision=PRECISION)
        b_column = tl.dot(b_z_t, b_k, input_precision=PRECISION)
        b_row_k = tl.sum(b_k * b_row, axis=1)
        b_dbeta += b_row_k
        b_dgc += b_beta * b_row_k - tl.sum(b_k * b_column, axis=1)
        p_dk = tl.make_block_ptr(dk + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        b_dk = tl.load(p_dk, boundary_check=(0, 1), padding_option="zero")
        tl.store(p_dk, b_dk + b_beta[:, None] * b_row + b_column, boundary_check=(0, 1))
    return b_dbeta, b_dgc


@triton.jit
def gdn_bwd_kernel_chunk(
    q, k, v, beta, do, gate_cumsum, inverse, states, leaving_grad, corrections, corrections_grad,
    dq, dk, dv, dbeta, dg, scratch, scale, T, N, first_chunk,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_n, i_bh = tl.program_id(0) + first_chunk, tl.program_id(1)
    chunk, o_c, token, gate_offset, b_beta, b_gc, key_base, value_base = _chunk_prelude(
        beta, gate_cumsum, i_n, i_bh, T, N, H, K, V, C)
    b_last = tl.sum(tl.where(o_c == C - 1, b_gc, 0.0), axis=0)
    b_e = tl.exp(b_gc)
    b_decay = decay_matrix(b_gc, True, C)
    dt = tl.float32  # the products' operand type
    b_t_t = tl.load(inverse + chunk * C * C + o_c[None, :] * C + o_c[:, None]).to(dt)
    # 1. value blocks
    b_dbeta = tl.zeros([C], dtype=tl.float32)
    b_dt = tl.zeros([C, C], dtype=tl.float32)
    b_p = tl.zeros([C, C], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_v = tl.make_block_ptr(v + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
        p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
        p_v_t = tl.make_block_ptr(v + value_base, (V, T), (1, H * V), (i_v * BV, i_n * C), (BV, C), (0, 1))
        p_delta_t = tl.make_block_ptr(corrections + chunk * C * V, (V, C), (1, V), (i_v * BV, 0), (BV, C), (0, 1))
        p_dd = tl.make_block_ptr(corrections_grad + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_v_t = tl.load(p_v_t, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
        b_delta_t = tl.load(p_delta_t, boundary_check=(0, 1), padding_option="zero")
        b_dd = tl.load(p_dd, boundary_check=(0, 1), padding_option="zero")
        b_p += tl.dot(b_do.to(dt), b_delta_t.to(dt), input_precision=PRECISION)
        b_dt += tl.dot(b_dd.to(dt), (b_v_t * b_beta[None, :]).to(dt), input_precision=PRECISION)
        b_tdu = tl.dot(b_t_t, b_dd.to(dt), input_precision=PRECISION)
        b_dbeta += tl.sum(b_v * b_tdu, axis=1)
        p_dv = tl.make_block_ptr(dv + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
        tl.store(p_dv, (b_beta[:, None] * b_tdu).to(p_dv.dtype.element_ty), boundary_check=(0, 1))
    # 2. key blocks: the outputs, W, KE and the chunk decay; (D o P)^T through the chunk's scratch slot
    b_dp = b_decay * b_p
    scratch_base = scratch + chunk * C * C
    tl.store(scratch_base + o_c[:, None] * C + o_c[None, :], b_dp)
    tl.debug_barrier()
    b_dp_t = tl.load(scratch_base + o_c[None, :] * C + o_c[:, None]).to(dt)
    b_dgc = tl.zeros([C], dtype=tl.float32)
    b_state_products = tl.zeros([BK], dtype=tl.float32)
    b_end_terms = tl.zeros([C], dtype=tl.float32)
    b_end = tl.exp(b_last - b_gc)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        p_k = tl.make_block_ptr(k + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32) * scale
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_dos = tl.zeros([C, BK], dtype=tl.float32)
        b_dds = tl.zeros([C, BK], dtype=tl.float32)
        b_dke = tl.zeros([C, BK], dtype=tl.float32)
        for i_v in range(tl.cdiv(V, BV)):
            p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
            p_delta = tl.make_block_ptr(corrections + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
            p_dd = tl.make_block_ptr(corrections_grad + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
            # [BV, BK] views of the chunk's [K, V] state and leaving-state gradient
            p_s_t = tl.make_block_ptr(states + chunk * K * V, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
            p_g_t = tl.make_block_ptr(leaving_grad + chunk * K * V, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
            b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_delta = tl.load(p_delta, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_dd = tl.load(p_dd, boundary_check=(0, 1), padding_option="zero")
            b_s_t = tl.load(p_s_t, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_g_t = tl.load(p_g_t, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_dos += tl.dot(b_do.to(dt), b_s_t.to(dt), input_precision=PRECISION)
            b_dds += tl.dot(b_dd.to(dt), b_s_t.to(dt), input_precision=PRECISION)
            b_dke += tl.dot(b_delta.to(dt), b_g_t.to(dt), input_precision=PRECISION)
            b_state_products += tl.sum(b_s_t * b_g_t, axis=0)
        b_dq_intra = tl.dot(b_dp.to(dt), b_k.to(dt), input_precision=PRECISION)
        b_dq = b_e[:, None] * b_dos + b_dq_intra
        p_dq = tl.make_block_ptr(dq + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        tl.store(p_dq, (b_dq * scale).to(p_dq.dtype.element_ty), boundary_check=(0, 1))
        b_dk = tl.dot(b_dp_t, b_q.to(dt), input_precision=PRECISION)
        b_dgc += tl.sum(b_q * b_dq, axis=1) - tl.sum(b_k * b_dk, axis=1)
        p_k_t = tl.make_block_ptr(k + key_base, (K, T), (1, H * K), (i_k * BK, i_n * C), (BK, C), (0, 1))
        b_gated_t = tl.load(p_k_t, boundary_check=(0, 1), padding_option="zero").to(tl.float32) * (b_beta * b_e)[None, :]
        b_dt -= tl.dot(b_dds.to(dt), b_gated_t.to(dt), input_precision=PRECISION)
        b_tdw = -tl.dot(b_t_t, b_dds.to(dt), input_precision=PRECISION)
        b_dk += (b_beta * b_e)[:, None] * b_tdw
        b_kw = tl.sum(b_k * b_tdw, axis=1)
        b_dbeta += b_e * b_kw
        b_dgc += b_beta * b_e * b_kw
        b_dk += b_end[:, None] * b_dke
        b_ke = tl.sum(b_k * b_dke, axis=1) * b_end
        b_dgc -= b_ke
        b_end_terms += b_ke
        p_dk = tl.make_block_ptr(dk + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
        tl.store(p_dk, b_dk, boundary_check=(0, 1))
    # 3. A = beta D o K K^T
    tl.debug_barrier()
    b_dbeta, b_dgc = _solve_terms(
        k, dk, b_t_t, b_dt, b_beta, b_gc, b_dbeta, b_dgc, scratch_base, key_base, i_n, T, H, K, C, BK, PRECISION)
    # 4. the chunk-end terms belong to gc_C, the last row; dg is the reverse cumsum of dgc
    b_dlast = tl.sum(b_state_products, axis=0) * tl.exp(b_last) + tl.sum(b_end_terms, axis=0)
    b_dgc += tl.where(o_c == C - 1, b_dlast, 0.0)
    b_dg = tl.sum(b_dgc, axis=0) - tl.cumsum(b_dgc, axis=0) + b_dgc
    tl.store(dg + gate_offset, b_dg, mask=token < T)
    tl.store(dbeta + gate_offset, b_dbeta, mask=token < T)


@triton.jit
def _value_operand(tile, STORED: tl.constexpr):
    """A loaded tile as a product operand: as stored when ``STORED``, else float32."""
    return tile.to(tile.dtype if STORED else tl.float32)


@triton.jit
def gdn_bwd_kernel_key_block(
    q, k, beta, do, gate_cumsum, inverse, states, leaving_grad, corrections, corrections_grad,
    dq, dk, partial_dt, partial_dbeta, partial_dgc, scale, T, N, first_chunk,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr, STORED_OPERANDS: tl.constexpr = False, TRANSPOSE_SCORES: tl.constexpr = False,
):
    """The split backward's first kernel, one program per (key block, chunk, batch * head): steps 1-2 of
    ``gdn_bwd_kernel_chunk`` that need only this key block (dq complete; into dk the terms of the outputs, W and
    KE; this block's shares of dT, dbeta and dgc into ``partial_*`` [key blocks, B * H * N, ...]). P and P^T are
    both accumulated as products (P^T = Delta dO^T), so no tile is transposed and no scratch is needed.

    With ``STORED_OPERANDS`` the value loop's products of dO, Delta, S and G take them in the dtype they are stored
    in instead of float32: the same products when that dtype is bfloat16 (a bfloat16 value is exact in tf32, the
    reduced precision), with 16-bit tiles in registers and shared memory. dDelta is float32 either way. With
    ``TRANSPOSE_SCORES`` dk's output term takes (D o P)^T as the transpose of the register tile that dq's takes,
    instead of accumulating P^T as a product of its own."""
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1) + first_chunk, tl.program_id(2)
    chunk, o_c, token, gate_offset, b_beta, b_gc, key_base, value_base = _chunk_prelude(
        beta, gate_cumsum, i_n, i_bh, T, N, H, K, V, C)
    b_last = tl.sum(tl.where(o_c == C - 1, b_gc, 0.0), axis=0)
    b_e = tl.exp(b_gc)
    b_p = tl.zeros([C, C], dtype=tl.float32)
    if not TRANSPOSE_SCORES:
        b_p_t = tl.zeros([C, C], dtype=tl.float32)
    b_dos = tl.zeros([C, BK], dtype=tl.float32)
    b_dds = tl.zeros([C, BK], dtype=tl.float32)
    b_dke = tl.zeros([C, BK], dtype=tl.float32)
    b_state_products = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
        p_do_t = tl.make_block_ptr(do + value_base, (V, T), (1, H * V), (i_v * BV, i_n * C), (BV, C), (0, 1))
        p_delta = tl.make_block_ptr(corrections + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
        p_delta_t = tl.make_block_ptr(corrections + chunk * C * V, (V, C), (1, V), (i_v * BV, 0), (BV, C), (0, 1))
        p_dd = tl.make_block_ptr(corrections_grad + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
        # [BV, BK] views of the chunk's [K, V] state and leaving-state gradient
        p_s_t = tl.make_block_ptr(states + chunk * K * V, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
        p_g_t = tl.make_block_ptr(leaving_grad + chunk * K * V, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
        b_do = _value_operand(tl.load(p_do, boundary_check=(0, 1), padding_option="zero"), STORED_OPERANDS)
        b_delta = _value_operand(tl.load(p_delta, boundary_check=(0, 1), padding_option="zero"), STORED_OPERANDS)
        b_delta_t = _value_operand(tl.load(p_delta_t, boundary_check=(0, 1), padding_option="zero"), STORED_OPERANDS)
        b_dd = tl.load(p_dd, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_s_t = _value_operand(tl.load(p_s_t, boundary_check=(0, 1), padding_option="zero"), STORED_OPERANDS)
        b_g_t = _value_operand(tl.load(p_g_t, boundary_check=(0, 1), padding_option="zero"), STORED_OPERANDS)
        b_p += tl.dot(b_do, b_delta_t, input_precision=PRECISION)
        if not TRANSPOSE_SCORES:
            b_p_t += tl.dot(b_delta, _value_operand(tl.load(p_do_t, boundary_check=(0, 1), padding_option="zero"),
                                                    STORED_OPERANDS), input_precision=PRECISION)
        b_dos += tl.dot(b_do, b_s_t, input_precision=PRECISION)
        b_dds += tl.dot(b_dd, b_s_t.to(tl.float32), input_precision=PRECISION)
        b_dke += tl.dot(b_delta, b_g_t, input_precision=PRECISION)
        b_state_products += tl.sum(b_s_t.to(tl.float32) * b_g_t.to(tl.float32), axis=0)
    p_q = tl.make_block_ptr(q + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
    p_k = tl.make_block_ptr(k + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32) * scale
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    # the outputs: dq complete, D^T o P^T for dk
    b_dp = decay_matrix(b_gc, True, C) * b_p
    b_dq = b_e[:, None] * b_dos + tl.dot(b_dp, b_k, input_precision=PRECISION)
    p_dq = tl.make_block_ptr(dq + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
    tl.store(p_dq, (b_dq * scale).to(p_dq.dtype.element_ty), boundary_check=(0, 1))
    if TRANSPOSE_SCORES:
        b_dk = tl.dot(tl.trans(b_dp), b_q, input_precision=PRECISION)
    else:
        upper = o_c[:, None] <= o_c[None, :]
        b_decay_t = tl.where(upper, tl.exp(tl.where(upper, b_gc[None, :] - b_gc[:, None], 0.0)), 0.0)
        b_dk = tl.dot(b_decay_t * b_p_t, b_q, input_precision=PRECISION)
    b_dgc = tl.sum(b_q * b_dq, axis=1) - tl.sum(b_k * b_dk, axis=1)
    # W: dW = -dDelta S^T
    b_t_t = tl.load(inverse + chunk * C * C + o_c[None, :] * C + o_c[:, None])
    b_tdw = -tl.dot(b_t_t, b_dds, input_precision=PRECISION)
    b_dk += (b_beta * b_e)[:, None] * b_tdw
    b_kw = tl.sum(b_k * b_tdw, axis=1)
    b_dbeta = b_e * b_kw
    b_dgc += b_beta * b_e * b_kw
    # KE and the chunk decay; their chunk-end terms belong to gc_C, the last row
    b_end = tl.exp(b_last - b_gc)
    b_dk += b_end[:, None] * b_dke
    b_ke = tl.sum(b_k * b_dke, axis=1) * b_end
    b_dlast = tl.sum(b_state_products, axis=0) * tl.exp(b_last) + tl.sum(b_ke, axis=0)
    b_dgc += tl.where(o_c == C - 1, b_dlast, 0.0) - b_ke
    p_dk = tl.make_block_ptr(dk + key_base, (T, K), (H * K, 1), (i_n * C, i_k * BK), (C, BK), (1, 0))
    tl.store(p_dk, b_dk, boundary_check=(0, 1))
    # this block's share of dT: -dW-side product dDelta S^T (B E K)^T
    p_k_t = tl.make_block_ptr(k + key_base, (K, T), (1, H * K), (i_k * BK, i_n * C), (BK, C), (0, 1))
    b_gated_t = tl.load(p_k_t, boundary_check=(0, 1), padding_option="zero").to(tl.float32) * (b_beta * b_e)[None, :]
    b_dt = -tl.dot(b_dds, b_gated_t, input_precision=PRECISION)
    share = i_k.to(tl.int64) * N * tl.num_programs(2) + chunk
    tl.store(partial_dt + share * C * C + o_c[:, None] * C + o_c[None, :], b_dt)
    tl.store(partial_dbeta + share * C + o_c, b_dbeta)
    tl.store(partial_dgc + share * C + o_c, b_dgc)


@triton.jit
def gdn_bwd_kernel_wy_block(
    k, v, beta, gate_cumsum, inverse, corrections_grad, dk, dv, dbeta, dg, partial_dt, partial_dbeta, partial_dgc,
    scratch, T, N, first_chunk,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The split backward's second kernel, one program per (chunk, batch * head): dv and the U terms (step 1 of
    ``gdn_bwd_kernel_chunk`` without P), the key blocks' shares summed, then steps 3-4: the solve's terms added
    into dk, and dbeta and dg written."""
    i_n, i_bh = tl.program_id(0) + first_chunk, tl.program_id(1)
    chunk, o_c, token, gate_offset, b_beta, b_gc, key_base, value_base = _chunk_prelude(
        beta, gate_cumsum, i_n, i_bh, T, N, H, K, V, C)
    b_t_t = tl.load(inverse + chunk * C * C + o_c[None, :] * C + o_c[:, None])
    b_dbeta = tl.zeros([C], dtype=tl.float32)
    b_dgc = tl.zeros([C], dtype=tl.float32)
    b_dt = tl.zeros([C, C], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_v = tl.make_block_ptr(v + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
        p_v_t = tl.make_block_ptr(v + value_base, (V, T), (1, H * V), (i_v * BV, i_n * C), (BV, C), (0, 1))
        p_dd = tl.make_block_ptr(corrections_grad + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_v_t = tl.load(p_v_t, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_dd = tl.load(p_dd, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_dt += tl.dot(b_dd, b_v_t * b_beta[None, :], input_precision=PRECISION)
        b_tdu = tl.dot(b_t_t, b_dd, input_precision=PRECISION)
        b_dbeta += tl.sum(b_v * b_tdu, axis=1)
        p_dv = tl.make_block_ptr(dv + value_base, (T, V), (H * V, 1), (i_n * C, i_v * BV), (C, BV), (1, 0))
        tl.store(p_dv, (b_beta[:, None] * b_tdu).to(p_dv.dtype.element_ty), boundary_check=(0, 1))
    shares = N * tl.num_programs(1)
    for i_k in range(tl.cdiv(K, BK)):
        share = i_k * shares + chunk
        b_dt += tl.load(partial_dt + share * C * C + o_c[:, None] * C + o_c[None, :])
        b_dbeta += tl.load(partial_dbeta + share * C + o_c)
        b_dgc += tl.load(partial_dgc + share * C + o_c)
    # the solve: A = beta D o K K^T
    b_dbeta, b_dgc = _solve_terms(
        k, dk, b_t_t, b_dt, b_beta, b_gc, b_dbeta, b_dgc, scratch + chunk * C * C, key_base, i_n, T, H, K, C, BK,
        PRECISION,
    )
    b_dg = tl.sum(b_dgc, axis=0) - tl.cumsum(b_dgc, axis=0) + b_dgc
    tl.store(dg + gate_offset, b_dg, mask=token < T)
    tl.store(dbeta + gate_offset, b_dbeta, mask=token < T)
