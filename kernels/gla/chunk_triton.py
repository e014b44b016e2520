"""Triton chunked GLA: kernels, host functions and the Triton implementation of chunk_gla.

Forward, two kernels: the state pass with the chunk updates and the gate cumsum fused in
(kernels/common/triton_scan.py), then `gla_fwd_kernel_output`, one program per chunk (and block of value
columns) that builds the chunk's 64 x 64 gated scores in registers and writes o. Backward, three kernels:
one launch running the recomputed forward state pass and the reverse state-gradient pass side by side,
`gla_bwd_kernel_dv` (rebuilds the transposed scores) and `gla_bwd_kernel_dqkg` (score gradients, the gated
intra-chunk sums for dq and dk, the state terms and dg). kernels/gla/README.md derives every formula.

Gated scores without overflow: for rows in 16-token sub-chunk x and columns in earlier sub-chunks, the
decay factors around r_x (cumulative gate at x's first row) into exp(gc_i - r_x) <= 1 and exp(r_x - gc_j)
<= 1, so each sub-chunk's strip is one 64 x 64 matrix product with the other rows and columns masked to
zero (masks go into the exponent, as -inf, so no factor is ever computed above 1). The 16 x 16 diagonal
blocks are summed exactly, one column offset at a time, with exp(-|gc_i - gc_j|), which is exp(gc_i - gc_j)
wherever the pair is causal and stays finite where it is not (those entries are masked or multiplied by a
masked weight). No kernel feeds a transposed matrix-product accumulator cast to 16 bits into another
product (Triton 3.4-3.7.0 miscompiles that on Hopper): transposed products are built from operands loaded
transposed from memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.function import Implementation
from schedlang.kernels.common.triton_scan import chunk_state_passes, new_output

CHUNK = 64
SUB_CHUNK = 16


@triton.jit
def gla_fwd_kernel_output(
    q, k, v, gate_cumsum, states, output, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, NC: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # o = scale * (q * exp(gc)) S_n + A v, A_ij = scale * sum_k q_ik k_jk exp(gc_ik - gc_jk) for j <= i.
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    base = i_b * T * H * K + i_h * K
    o_i = tl.arange(0, BT)
    o_t = i_n * BT + o_i
    row_valid = o_t < T
    sub_chunk = o_i // BC
    state_base = states + (i_bh * NT + i_n).to(tl.int64) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_a = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        key_valid = o_k < K
        p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_kt = tl.make_block_ptr(k + base, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
        p_gct = tl.make_block_ptr(gate_cumsum + base, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
        p_h = tl.make_block_ptr(state_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
        b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
        b_kt = tl.load(p_kt, boundary_check=(0, 1), padding_option="zero")
        b_gct = tl.load(p_gct, boundary_check=(0, 1), padding_option="zero")
        b_h = tl.load(p_h, boundary_check=(0, 1))
        b_o += tl.dot((b_q * tl.exp(b_gc)).to(b_h.dtype), b_h)
        for x in range(1, NC):
            ref_row = tl.minimum(i_n * BT + x * BC, T - 1)
            b_ref = tl.load(gate_cumsum + base + ref_row * H * K + o_k, mask=key_valid, other=0.0)
            in_x = (sub_chunk == x) & row_valid
            b_qg = b_q * tl.exp(tl.where(in_x[:, None], b_gc - b_ref[None, :], float("-inf")))
            b_kg = b_kt * tl.exp(tl.where((o_i < x * BC)[None, :], b_ref[:, None] - b_gct, float("-inf")))
            b_a += tl.dot(b_qg.to(b_q.dtype), b_kg.to(b_q.dtype))
        b_qf = b_q.to(tl.float32)
        for j in range(BC):
            # column sub_chunk * BC + j of every row's own sub-chunk (a gather from the chunk's rows)
            o_src = sub_chunk * BC + j
            t_src = i_n * BT + o_src
            p_src = base + t_src[:, None] * H * K + o_k[None, :]
            src_mask = (t_src < T)[:, None] & key_valid[None, :]
            b_ks = tl.load(k + p_src, mask=src_mask, other=0.0).to(tl.float32)
            b_gs = tl.load(gate_cumsum + p_src, mask=src_mask, other=0.0)
            b_d = tl.sum(b_qf * b_ks * tl.exp(-tl.abs(b_gc - b_gs)), axis=1)
            b_d = tl.where(o_src <= o_i, b_d, 0.0)
            b_a += tl.where(o_i[None, :] == o_src[:, None], b_d[:, None], 0.0)
    p_v = tl.make_block_ptr(v + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
    b_o = b_o * scale + tl.dot((b_a * scale).to(b_v.dtype), b_v)
    p_o = tl.make_block_ptr(output + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gla_bwd_kernel_dv(
    q, k, do, gate_cumsum, state_grads, dv, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, NC: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # dv = A^T do + (k * exp(gl - gc)) dS_{n+1}, with A^T [j, i] built directly (rows j, columns i).
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    base = i_b * T * H * K + i_h * K
    o_i = tl.arange(0, BT)
    o_t = i_n * BT + o_i
    row_valid = o_t < T
    sub_chunk = o_i // BC
    last_row = tl.minimum(i_n * BT + BT - 1, T - 1)
    grad_base = state_grads + (i_bh * NT + i_n).to(tl.int64) * K * V
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    b_at = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        key_valid = o_k < K
        p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
        p_qt = tl.make_block_ptr(q + base, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
        p_gct = tl.make_block_ptr(gate_cumsum + base, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
        p_dh = tl.make_block_ptr(grad_base, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
        b_qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero")
        b_gct = tl.load(p_gct, boundary_check=(0, 1), padding_option="zero")
        b_dh = tl.load(p_dh, boundary_check=(0, 1))
        b_gl = tl.load(gate_cumsum + base + last_row * H * K + o_k, mask=key_valid, other=0.0)
        b_dv += tl.dot((b_k * tl.exp(b_gl[None, :] - b_gc)).to(b_dh.dtype), b_dh)
        for x in range(1, NC):
            ref_row = tl.minimum(i_n * BT + x * BC, T - 1)
            b_ref = tl.load(gate_cumsum + base + ref_row * H * K + o_k, mask=key_valid, other=0.0)
            in_x = (sub_chunk == x) & row_valid
            b_kg = b_k * tl.exp(tl.where((o_i < x * BC)[:, None], b_ref[None, :] - b_gc, float("-inf")))
            b_qg = b_qt * tl.exp(tl.where(in_x[None, :], b_gct - b_ref[:, None], float("-inf")))
            b_at += tl.dot(b_kg.to(b_k.dtype), b_qg.to(b_k.dtype))
        b_kf = b_k.to(tl.float32)
        for j in range(BC):
            # row sub_chunk * BC + j of every column token's own sub-chunk: the rows i >= j of A^T's diagonal block
            o_src = sub_chunk * BC + j
            t_src = i_n * BT + o_src
            p_src = base + t_src[:, None] * H * K + o_k[None, :]
            src_mask = (t_src < T)[:, None] & key_valid[None, :]
            b_qs = tl.load(q + p_src, mask=src_mask, other=0.0).to(tl.float32)
            b_gs = tl.load(gate_cumsum + p_src, mask=src_mask, other=0.0)
            b_d = tl.sum(b_kf * b_qs * tl.exp(-tl.abs(b_gs - b_gc)), axis=1)
            b_d = tl.where(o_src >= o_i, b_d, 0.0)
            b_at += tl.where(o_i[None, :] == o_src[:, None], b_d[:, None], 0.0)
    p_do = tl.make_block_ptr(do + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    b_dv += tl.dot((b_at * scale).to(b_do.dtype), b_do)
    p_dv = tl.make_block_ptr(dv + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_dv, b_dv.to(p_dv.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def gla_bwd_kernel_dqkg(
    q, k, v, do, gate_cumsum, states, state_grads, dq, dk, dg, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, NC: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    # dA = scale * do v^T (causal) and its transpose (built directly), the gated sums
    #   dq_i += sum_{j <= i} dA_ij k_j exp(gc_i - gc_j),   dk_j += sum_{i >= j} dA_ij q_i exp(gc_i - gc_j),
    # the state terms, and dg = reverse-cumsum_in_chunk(q dq - k dk) + sum_v(S_{n+1} dS_{n+1}).
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    key_valid = o_k < K
    o_i = tl.arange(0, BT)
    o_t = i_n * BT + o_i
    row_valid = o_t < T
    sub_chunk = o_i // BC
    last_row = tl.minimum(i_n * BT + BT - 1, T - 1)
    chunk_offset = (i_bh * NT + i_n).to(tl.int64) * K * V
    b_da = tl.zeros([BT, BT], dtype=tl.float32)
    b_dat = tl.zeros([BT, BT], dtype=tl.float32)
    b_dq_state = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk_state = tl.zeros([BT, BK], dtype=tl.float32)
    b_boundary = tl.zeros([BK], dtype=tl.float32)
    value_base = i_b * T * H * V + i_h * V
    for i_v in range(tl.cdiv(V, BV)):
        p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        p_v = tl.make_block_ptr(v + value_base, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        p_vt = tl.make_block_ptr(v + value_base, (V, T), (1, H * V), (i_v * BV, i_n * BT), (BV, BT), (0, 1))
        p_dot = tl.make_block_ptr(do + value_base, (V, T), (1, H * V), (i_v * BV, i_n * BT), (BV, BT), (0, 1))
        # [BV, BK] views of the [K, V] state and state gradient
        p_ht = tl.make_block_ptr(states + chunk_offset, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
        p_dht = tl.make_block_ptr(state_grads + chunk_offset, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
        b_vt = tl.load(p_vt, boundary_check=(0, 1), padding_option="zero")
        b_dot = tl.load(p_dot, boundary_check=(0, 1), padding_option="zero")
        b_ht = tl.load(p_ht, boundary_check=(0, 1))
        b_dht = tl.load(p_dht, boundary_check=(0, 1))
        b_da += tl.dot(b_do, b_vt)
        b_dat += tl.dot(b_v, b_dot)
        b_dq_state += tl.dot(b_do.to(b_ht.dtype), b_ht)
        b_dk_state += tl.dot(b_v.to(b_dht.dtype), b_dht)
        b_boundary += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), axis=0)
    b_da = tl.where(o_i[:, None] >= o_i[None, :], b_da * scale, 0.0)
    b_dat = tl.where(o_i[:, None] <= o_i[None, :], b_dat * scale, 0.0)
    base = i_b * T * H * K + i_h * K
    p_q = tl.make_block_ptr(q + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_k = tl.make_block_ptr(k + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_gc = tl.make_block_ptr(gate_cumsum + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
    b_gc = tl.load(p_gc, boundary_check=(0, 1), padding_option="zero")
    b_gl = tl.load(gate_cumsum + base + last_row * H * K + o_k, mask=key_valid, other=0.0)
    b_dq = b_dq_state * scale * tl.exp(b_gc)
    b_dk_state = b_dk_state * tl.exp(b_gl[None, :] - b_gc)
    b_dk = b_dk_state
    for x in range(1, NC):
        # rows i in sub-chunk x, columns j before it, around r_x = gc at x's first row
        ref_row = tl.minimum(i_n * BT + x * BC, T - 1)
        b_ref = tl.load(gate_cumsum + base + ref_row * H * K + o_k, mask=key_valid, other=0.0)
        in_x = (sub_chunk == x) & row_valid
        b_kg = b_k * tl.exp(tl.where((o_i < x * BC)[:, None], b_ref[None, :] - b_gc, float("-inf")))
        b_part = tl.dot(tl.where(in_x[:, None], b_da, 0.0).to(b_k.dtype), b_kg.to(b_k.dtype))
        b_dq += b_part * tl.exp(tl.where(in_x[:, None], b_gc - b_ref[None, :], float("-inf")))
    for y in range(NC - 1):
        # columns j in sub-chunk y, rows i after it, around e_y = gc at y's last row
        end_row = tl.minimum(i_n * BT + y * BC + BC - 1, T - 1)
        b_end = tl.load(gate_cumsum + base + end_row * H * K + o_k, mask=key_valid, other=0.0)
        in_y = (sub_chunk == y) & row_valid
        after_y = (o_i >= (y + 1) * BC) & row_valid
        b_qg = b_q * tl.exp(tl.where(after_y[:, None], b_gc - b_end[None, :], float("-inf")))
        b_part = tl.dot(tl.where(in_y[:, None], b_dat, 0.0).to(b_q.dtype), b_qg.to(b_q.dtype))
        b_dk += b_part * tl.exp(tl.where(in_y[:, None], b_end[None, :] - b_gc, float("-inf")))
    for j in range(BC):
        # the diagonal blocks, exact: partner token sub_chunk * BC + j of every token's own sub-chunk
        o_src = sub_chunk * BC + j
        t_src = i_n * BT + o_src
        p_src = base + t_src[:, None] * H * K + o_k[None, :]
        src_mask = (t_src < T)[:, None] & key_valid[None, :]
        b_ks = tl.load(k + p_src, mask=src_mask, other=0.0).to(tl.float32)
        b_qs = tl.load(q + p_src, mask=src_mask, other=0.0).to(tl.float32)
        b_gs = tl.load(gate_cumsum + p_src, mask=src_mask, other=0.0)
        b_decay = tl.exp(-tl.abs(b_gc - b_gs))
        pick = o_i[None, :] == o_src[:, None]
        # dA[i, src] is zero for src > i and dA^T[j, src] = dA[src, j] zero for src < j (causal masks above)
        b_da_column = tl.sum(tl.where(pick, b_da, 0.0), axis=1)
        b_dat_column = tl.sum(tl.where(pick, b_dat, 0.0), axis=1)
        b_dq += b_da_column[:, None] * b_ks * b_decay
        b_dk += b_dat_column[:, None] * b_qs * b_decay
    b_qf = b_q.to(tl.float32)
    b_kf = b_k.to(tl.float32)
    b_boundary = b_boundary * tl.exp(b_gl) + tl.sum(b_kf * b_dk_state, axis=0)
    b_terms = b_qf * b_dq - b_kf * b_dk
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


def _contiguous(*tensors):
    return [tensor.contiguous() for tensor in tensors]


def forward(q, k, v, g, scale, initial_state):
    q, k, v, g = _contiguous(q, k, v, g)
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    n_chunks = triton.cdiv(length, CHUNK)
    gate_cumsum, states, final_state, _, _ = chunk_state_passes(k, v, g, initial_state, _states_dtype(k.dtype), CHUNK)
    output = new_output(v.shape, v.dtype, v.device)
    block_v = _blocks(value_dim, 128)
    gla_fwd_kernel_output[(triton.cdiv(value_dim, block_v), n_chunks, batch * heads)](
        q, k, v, gate_cumsum, states, output, scale, length, n_chunks,
        H=heads, K=key_dim, V=value_dim, BT=CHUNK, BC=SUB_CHUNK, NC=CHUNK // SUB_CHUNK,
        BK=_blocks(key_dim, 32), BV=block_v, num_warps=8,
    )
    return output, final_state


def backward(q, k, v, g, scale, initial_state, do, final_state_grad):
    q, k, v, g, do = _contiguous(q, k, v, g, do)
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    n_chunks = triton.cdiv(length, CHUNK)
    gate_cumsum, states, _, state_grads, initial_grad = chunk_state_passes(
        k, v, g, initial_state, _states_dtype(k.dtype), CHUNK, reverse_inputs=(q, do, scale, final_state_grad)
    )
    dv = new_output(v.shape, v.dtype, v.device)
    block_v = _blocks(value_dim, 128)
    gla_bwd_kernel_dv[(triton.cdiv(value_dim, block_v), n_chunks, batch * heads)](
        q, k, do, gate_cumsum, state_grads, dv, scale, length, n_chunks,
        H=heads, K=key_dim, V=value_dim, BT=CHUNK, BC=SUB_CHUNK, NC=CHUNK // SUB_CHUNK,
        BK=_blocks(key_dim, 32), BV=block_v, num_warps=8,
    )
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, k.dtype, k.device)
    dg = new_output(g.shape, torch.float32, g.device)
    block_k = _blocks(key_dim, 32)
    gla_bwd_kernel_dqkg[(triton.cdiv(key_dim, block_k), n_chunks, batch * heads)](
        q, k, v, do, gate_cumsum, states, state_grads, dq, dk, dg, scale, length, n_chunks,
        H=heads, K=key_dim, V=value_dim, BT=CHUNK, BC=SUB_CHUNK, NC=CHUNK // SUB_CHUNK,
        BK=block_k, BV=_blocks(value_dim, 64), num_warps=8,
        # float32 tiles at three pipeline stages come within 3 KB of the 227 KB of shared memory a block may use
        num_stages=2 if q.dtype == torch.float32 else 3,
    )
    return dq, dk, dv, dg, initial_grad


TRITON_IMPLEMENTATION = Implementation("triton", forward, backward)
