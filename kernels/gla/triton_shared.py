"""Triton pieces both GLA paths use: which path a chunk takes (per chunk, and per group of chunks for the
steep-path launches), and the last step of dq/dk/dg."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_is_smooth(gate_span, i_bh, i_n, NT, span_limit, K: tl.constexpr, KP: tl.constexpr):
    """True when no key's cumulative gate spans more than span_limit over chunk i_n: one reference then
    factorises every exp(gc_i - gc_j) of the chunk into two factors within exp(+-span_limit / 2)."""
    o_k = tl.arange(0, KP)
    b_span = tl.load(gate_span + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0)
    return tl.max(b_span, axis=0) <= span_limit


@triton.jit
def chunk_is_steep(gate_span, span_limit, chunk, n_all, K: tl.constexpr, KP: tl.constexpr):
    """True when chunk ``chunk`` of the flattened (batch * head, chunk) index exists and is not smooth."""
    o_k = tl.arange(0, KP)
    b_span = tl.load(gate_span + chunk.to(tl.int64) * K + o_k, mask=(o_k < K) & (chunk < n_all), other=0.0)
    return tl.max(b_span, axis=0) > span_limit


@triton.jit
def group_has_steep_chunk(gate_span, span_limit, i_group, n_all, K: tl.constexpr, KP: tl.constexpr, CG: tl.constexpr):
    """Whether any of chunks [i_group * CG, (i_group + 1) * CG) of the flattened index is steep: the steep-path
    kernels run one program per group and block, so on smooth data each program costs one [CG, K] load."""
    o_c = i_group * CG + tl.arange(0, CG)
    o_k = tl.arange(0, KP)
    mask = (o_c < n_all)[:, None] & (o_k < K)[None, :]
    b_span = tl.load(gate_span + o_c.to(tl.int64)[:, None] * K + o_k[None, :], mask=mask, other=0.0)
    return tl.max(tl.max(b_span, axis=1), axis=0) > span_limit


@triton.jit
def store_key_gradients(
    b_q, b_k, b_dq, b_dk, b_dk_state, b_boundary, b_gl, dq, dk, dg, base, i_n, i_k, T,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
):
    """Store dq, dk and dg for keys [i_k * BK, ...) of chunk i_n, with (kernels/gla/README.md)
    dg = reverse-cumsum_in_chunk(q dq - k dk) + sum_v(S_{n+1} dS_{n+1}) and
    sum_v(S_{n+1} dS_{n+1}) = exp(gl) sum_v(S_n dS_{n+1}) + sum_j k_j dk_state_j; b_boundary is the first sum,
    b_q and b_k are float32."""
    b_boundary = b_boundary * tl.exp(b_gl) + tl.sum(b_k * b_dk_state, axis=0)
    b_terms = b_q * b_dq - b_k * b_dk
    b_dg = tl.sum(b_terms, axis=0)[None, :] - tl.cumsum(b_terms, axis=0) + b_terms + b_boundary[None, :]
    p_dq = tl.make_block_ptr(dq + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dk = tl.make_block_ptr(dk + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    p_dg = tl.make_block_ptr(dg + base, (T, K), (H * K, 1), (i_n * BT, i_k * BK), (BT, BK), (1, 0))
    tl.store(p_dq, b_dq.to(p_dq.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dk, b_dk.to(p_dk.dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dg, b_dg.to(p_dg.dtype.element_ty), boundary_check=(0, 1))
