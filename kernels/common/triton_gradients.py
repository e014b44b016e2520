"""Triton pieces shared by the GLA and simple-GLA backward kernels: what a chunk's dq/dk/dg need from the
value side, summed over V in blocks of BV. Transposes are of loaded inputs, never of a product's accumulator.
PRECISION is the products' ``input_precision`` for float32 operands (kernels/common/sizes.py,
``products_precision``); 16-bit operands ignore it. Callers always pass it: a jit function's default string
argument is not made a constexpr when compiled (Triton 3.6's code generator wraps only numbers, bools and
dtypes), so a default compiles in the interpreter and fails on the GPU."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_score_gradients(
    do, v, value_base, i_n, T, H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """do v^T and v do^T of chunk i_n ([BT, BT] each, unscaled, unmasked; the second formed directly)."""
    b_do_v = tl.zeros([BT, BT], dtype=tl.float32)
    b_v_do = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        p_v = tl.make_block_ptr(v + value_base, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
        b_do_v += tl.dot(b_do, tl.trans(b_v), input_precision=PRECISION)
        b_v_do += tl.dot(b_v, tl.trans(b_do), input_precision=PRECISION)
    return b_do_v, b_v_do


@triton.jit
def chunk_state_products(
    do, v, states, state_grads, value_base, chunk_offset, i_n, key_start, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """For keys [key_start, key_start + BK): do S_n^T and v dS^T ([BT, BK]) and sum_v(S_n * dS) ([BK]), with S_n
    the state entering the chunk and dS the gradient of the state leaving it ([K, V] each at chunk_offset)."""
    b_do_s = tl.zeros([BT, BK], dtype=tl.float32)
    b_v_ds = tl.zeros([BT, BK], dtype=tl.float32)
    b_s_ds = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        p_v = tl.make_block_ptr(v + value_base, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
        # [BV, BK] views of the [K, V] state and state gradient
        p_ht = tl.make_block_ptr(states + chunk_offset, (V, K), (1, V), (i_v * BV, key_start), (BV, BK), (0, 1))
        p_dht = tl.make_block_ptr(state_grads + chunk_offset, (V, K), (1, V), (i_v * BV, key_start), (BV, BK), (0, 1))
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
        b_ht = tl.load(p_ht, boundary_check=(0, 1))
        b_dht = tl.load(p_dht, boundary_check=(0, 1))
        b_do_s += tl.dot(b_do.to(b_ht.dtype), b_ht, input_precision=PRECISION)
        b_v_ds += tl.dot(b_v.to(b_dht.dtype), b_dht, input_precision=PRECISION)
        b_s_ds += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), axis=0)
    return b_do_s, b_v_ds, b_s_ds
