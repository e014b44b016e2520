"""Triton kernels for the gated delta rule's chunk-after-chunk state pass (kernels/gdn/state_pass.py).

One program per (value block, batch * head) walks the chunks in order (forward) or in reverse (backward) and
keeps its ``[K, BV]`` slice of the state, or of the state's gradient, in registers. Value columns never mix
in either recurrence, so the value blocks are independent programs. The state (or its gradient) stays float32
in registers; each product takes it, or the corrections, rounded to the dtype of the operand it meets (W or KE).
Float32 operands take the launch table's ``input_precision``: "ieee" (plain float32) or "tf32x3" (tensor cores,
three tf32 products, float32-level error), never plain "tf32", since this is where rounding compounds chunk
after chunk. 16-bit operands (kernels/gdn/chunk_triton.py stores them so for 16-bit inputs) run as 16-bit
products with float32 accumulation. Transposed operands are loaded transposed from memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.launch_tables import register_launch_table
from schedlang.kernels.common.sizes import block_size, cdiv, launch_options
from schedlang.kernels.common.triton_scan import INTERPRETED, new_output
from schedlang.kernels.gdn.overlap import Segment
from schedlang.kernels.gdn.triton_output import gated_queries_transposed

LAUNCH = register_launch_table("gdn", __name__, {
    "forward": {"block_v": 16, "precision": "tf32x3", "num_warps": 4, "num_stages": 3},
    "backward": {"block_v": 16, "precision": "tf32x3", "num_warps": 4, "num_stages": 3, "output_terms": 1},
    "wy_solve": {"block_k": 64, "num_warps": 4, "num_stages": 2},
    "wy_apply": {"block_k": 64, "block_v": 64, "num_warps": 4, "num_stages": 2},
    "output": {"block_k": 64, "block_v": 64, "num_warps": 4, "num_stages": 2},
    "output_gradients": {"block_k": 64, "block_v": 64, "num_warps": 4, "num_stages": 2},
    "chunk_gradients": {
        "block_k": 64, "block_v": 64, "num_warps": 4, "num_stages": 1, "split": 1, "value_operands": "stored",
        "transpose_scores": 1,
    },
    "products": {"float32": "tf32x3", "reduced": "tf32"},
    "overlap": {"segments": 1, "split": 0.5},
})
"""Launch table of every gdn kernel, read at call time ([Note: launch tables]). "forward" and "backward" are the state
pass's: value columns per program (a [K, 32] float32 state slice is 16 KiB at K = 128), the products' input
precision, warps, stages. The others are the per-chunk kernels of kernels/gdn/chunk_triton.py: tile edges (the
largest; smaller dimensions get smaller tiles), warps, stages; "products" is their products' input precision for
float32 inputs and for 16-bit ones (the per-chunk backward always takes float32 operands: the docstring of
triton_backward.py); "chunk_gradients"'s "split" runs that backward as two kernels (one per key block and chunk,
then one per chunk) instead of one, and its "value_operands" "stored" gives the first of those kernels' value-loop
products their operands in the dtype they are stored in ("float32": converted), and its "transpose_scores" 1
transposes a register tile there instead of forming a transposed product. "overlap" is the schedule of the whole
operator ([Note: gdn overlap] in kernels/gdn/chunk_triton.py): ``segments`` 1 runs each phase once over all kernel
chunks; 2 splits the chunks in two segments, the first holding ``split`` of them (a fraction in (0, 1), rounded to a
whole chunk), and runs each segment's state pass beside the other segment's per-chunk work on a second CUDA stream.
The backward's "output_terms" 1 has the backward state pass form each chunk's entering-state gradient
from the outputs (q, dO) itself, for 16-bit inputs, instead of reading it from memory, where the per-chunk
output-terms kernel would write it. Everything runs at most 4 warps: Triton 3.6 miscompiled the state pass's backward at 8 on an H200
(docs/benchmarks.md, "Launch tables")."""


@triton.jit
def _forward_step(
    updates, keys_in, keys_out, chunk_decay, entering_states, corrections, b_state, i_v, i_bh, n, N,
    C: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):
    # Delta_n = U_n - W_n S_n;  S_{n+1} = a_n S_n + KE_n^T Delta_n   (U: updates, W: keys_in, KE: keys_out)
    chunk = i_bh.to(tl.int64) * N + n
    p_enter = tl.make_block_ptr(entering_states + chunk * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_enter, b_state.to(p_enter.dtype.element_ty), boundary_check=(0, 1))
    p_u = tl.make_block_ptr(updates + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
    p_w = tl.make_block_ptr(keys_in + chunk * C * K, (C, K), (K, 1), (0, 0), (C, BK), (1, 0))
    p_ke_t = tl.make_block_ptr(keys_out + chunk * C * K, (K, C), (1, K), (0, 0), (BK, C), (0, 1))
    b_u = tl.load(p_u, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_w = tl.load(p_w, boundary_check=(0, 1), padding_option="zero")
    b_delta = b_u - tl.dot(b_w, b_state.to(b_w.dtype), input_precision=PRECISION)
    p_delta = tl.make_block_ptr(corrections + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
    tl.store(p_delta, b_delta.to(p_delta.dtype.element_ty), boundary_check=(0, 1))
    b_ke_t = tl.load(p_ke_t, boundary_check=(0, 1), padding_option="zero")
    return tl.load(chunk_decay + chunk) * b_state + tl.dot(b_ke_t, b_delta.to(b_ke_t.dtype), input_precision=PRECISION)


@triton.jit
def gdn_state_pass_forward_kernel(
    updates, keys_in, keys_out, chunk_decay, initial_state, entering_states, corrections, final_state, N,
    first_chunk, stop_chunk, C: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr, INTERPRETED: tl.constexpr, PRECISION: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    state_base = i_bh.to(tl.int64) * K * V
    if HAS_INITIAL_STATE:
        p_s0 = tl.make_block_ptr(initial_state + state_base, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_state = tl.load(p_s0, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    else:
        b_state = tl.zeros([BK, BV], dtype=tl.float32)
    if INTERPRETED:  # the interpreter cannot take a run-time range() bound ([Note: scan prefetch])
        n = first_chunk
        while n < stop_chunk:
            b_state = _forward_step(
                updates, keys_in, keys_out, chunk_decay, entering_states, corrections, b_state, i_v, i_bh, n, N,
                C, K, V, BK, BV, PRECISION,
            )
            n += 1
    else:
        for n in range(first_chunk, stop_chunk):
            b_state = _forward_step(
                updates, keys_in, keys_out, chunk_decay, entering_states, corrections, b_state, i_v, i_bh, n, N,
                C, K, V, BK, BV, PRECISION,
            )
    p_final = tl.make_block_ptr(final_state + state_base, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_final, b_state, boundary_check=(0, 1))


@triton.jit
def _outputs_state_grad(
    q, do, gate_cumsum, scale, i_v, i_bh, n, N, T, H: tl.constexpr,
    C: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):
    # dS_n(outputs) = (diag(exp(gc)) scale Q_n)^T dO_n, [BK, BV] float32, formed as
    # gdn_bwd_kernel_output_terms forms it (kernels/gdn/triton_output.py)
    i_b, i_h = i_bh // H, i_bh % H
    chunk = i_bh.to(tl.int64) * N + n
    dt = q.dtype.element_ty
    b_gc = tl.load(gate_cumsum + chunk * C + tl.arange(0, C))
    key_base = (i_b * T * H + i_h).to(tl.int64) * K
    value_base = (i_b * T * H + i_h).to(tl.int64) * V
    p_q_t = tl.make_block_ptr(q + key_base, (K, T), (1, H * K), (0, n * C), (BK, C), (0, 1))
    p_do = tl.make_block_ptr(do + value_base, (T, V), (H * V, 1), (n * C, i_v * BV), (C, BV), (1, 0))
    b_q_t = tl.load(p_q_t, boundary_check=(0, 1), padding_option="zero")
    b_qg_t = gated_queries_transposed(b_q_t, b_gc, scale).to(dt)
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    return tl.dot(b_qg_t, b_do.to(dt), input_precision=PRECISION)


@triton.jit
def _backward_step(
    keys_in, keys_out, chunk_decay, entering_grad, corrections_grad, corrections_grad_total, leaving_grad,
    q, do, gate_cumsum, scale, T, b_grad, i_v, i_bh, n, N, H: tl.constexpr,
    C: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_ENTERING_GRAD: tl.constexpr, HAS_CORRECTIONS_GRAD: tl.constexpr, HAS_OUTPUTS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # G = dL/dS_{n+1}:  dDelta_n = dDelta_n(ext) + KE_n G;  G <- a_n G + dS_n(ext) - W_n^T dDelta_n
    chunk = i_bh.to(tl.int64) * N + n
    p_leaving = tl.make_block_ptr(leaving_grad + chunk * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_leaving, b_grad.to(p_leaving.dtype.element_ty), boundary_check=(0, 1))
    p_ke = tl.make_block_ptr(keys_out + chunk * C * K, (C, K), (K, 1), (0, 0), (C, BK), (1, 0))
    b_ke = tl.load(p_ke, boundary_check=(0, 1), padding_option="zero")
    b_delta_grad = tl.dot(b_ke, b_grad.to(b_ke.dtype), input_precision=PRECISION)
    if HAS_CORRECTIONS_GRAD:
        p_dd = tl.make_block_ptr(corrections_grad + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
        b_delta_grad += tl.load(p_dd, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    p_total = tl.make_block_ptr(corrections_grad_total + chunk * C * V, (C, V), (V, 1), (0, i_v * BV), (C, BV), (1, 0))
    tl.store(p_total, b_delta_grad, boundary_check=(0, 1))
    p_w_t = tl.make_block_ptr(keys_in + chunk * C * K, (K, C), (1, K), (0, 0), (BK, C), (0, 1))
    b_w_t = tl.load(p_w_t, boundary_check=(0, 1), padding_option="zero")
    b_grad = tl.load(chunk_decay + chunk) * b_grad - tl.dot(b_w_t, b_delta_grad.to(b_w_t.dtype), input_precision=PRECISION)
    if HAS_ENTERING_GRAD:
        p_de = tl.make_block_ptr(entering_grad + chunk * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_grad += tl.load(p_de, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    if HAS_OUTPUTS:
        b_grad += _outputs_state_grad(q, do, gate_cumsum, scale, i_v, i_bh, n, N, T, H, C, K, V, BK, BV, PRECISION)
    return b_grad


@triton.jit
def gdn_state_pass_backward_kernel(
    keys_in, keys_out, chunk_decay, entering_grad, corrections_grad, final_grad,
    corrections_grad_total, leaving_grad, initial_grad, q, do, gate_cumsum, scale, T, N, first_chunk, stop_chunk,
    H: tl.constexpr, C: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_ENTERING_GRAD: tl.constexpr, HAS_CORRECTIONS_GRAD: tl.constexpr, HAS_FINAL_GRAD: tl.constexpr,
    HAS_OUTPUTS: tl.constexpr, INTERPRETED: tl.constexpr, PRECISION: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    state_base = i_bh.to(tl.int64) * K * V
    if HAS_FINAL_GRAD:
        p_final = tl.make_block_ptr(final_grad + state_base, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_grad = tl.load(p_final, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    else:
        b_grad = tl.zeros([BK, BV], dtype=tl.float32)
    if INTERPRETED:
        step = 0
        while step < stop_chunk - first_chunk:
            b_grad = _backward_step(
                keys_in, keys_out, chunk_decay, entering_grad, corrections_grad, corrections_grad_total, leaving_grad,
                q, do, gate_cumsum, scale, T, b_grad, i_v, i_bh, stop_chunk - 1 - step, N, H, C, K, V, BK, BV,
                HAS_ENTERING_GRAD, HAS_CORRECTIONS_GRAD, HAS_OUTPUTS, PRECISION,
            )
            step += 1
    else:
        for step in range(stop_chunk - first_chunk):
            b_grad = _backward_step(
                keys_in, keys_out, chunk_decay, entering_grad, corrections_grad, corrections_grad_total, leaving_grad,
                q, do, gate_cumsum, scale, T, b_grad, i_v, i_bh, stop_chunk - 1 - step, N, H, C, K, V, BK, BV,
                HAS_ENTERING_GRAD, HAS_CORRECTIONS_GRAD, HAS_OUTPUTS, PRECISION,
            )
    p_initial = tl.make_block_ptr(initial_grad + state_base, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_initial, b_grad, boundary_check=(0, 1))


def triton_state_pass_forward(
    updates, keys_in, keys_out, chunk_decay, initial_state, precision: str | None = None, stored=torch.float32,
    segment: Segment | None = None, outputs: tuple | None = None,
):
    """(entering states [B, H, N, K, V] and corrections [B, H, N, C, V] in ``stored``, final state [B, H, K, V]
    float32); operands as in kernels/gdn/state_pass.py, contiguous float32 (or 16-bit: read as float32) on one
    CUDA device (or the interpreter). ``precision``: the products' input precision, the launch table's if None.
    With a ``segment`` the pass starts from ``initial_state`` at the segment's first chunk, writes the entering
    states and corrections of its chunks only and returns the state after its last chunk as the final state.
    ``outputs``: the three tensors to write into (else new ones)."""
    batch, heads, n_chunks, chunk_size, key_dim = keys_in.shape
    value_dim = updates.shape[-1]
    segment = segment or Segment(0, n_chunks)
    launch = LAUNCH["forward"]
    bk, bv = block_size(key_dim, 256), block_size(value_dim, launch["block_v"])
    device = keys_in.device
    entering, corrections, final_state = outputs or (
        new_output((batch, heads, n_chunks, key_dim, value_dim), stored, device),
        new_output(updates.shape, stored, device),
        new_output((batch, heads, key_dim, value_dim), torch.float32, device),
    )
    grid = (cdiv(value_dim, bv), batch * heads)
    gdn_state_pass_forward_kernel[grid](
        updates, keys_in, keys_out, chunk_decay, initial_state if initial_state is not None else final_state,
        entering, corrections, final_state, n_chunks, segment.first, segment.stop,
        C=chunk_size, K=key_dim, V=value_dim, BK=bk, BV=bv, HAS_INITIAL_STATE=initial_state is not None,
        INTERPRETED=INTERPRETED, PRECISION=precision or launch["precision"], **launch_options(launch),
    )
    return entering, corrections, final_state


@dataclass(frozen=True)
class OutputsOfChunks:
    """What the backward state pass needs to form each chunk's entering-state gradient from the outputs itself,
    instead of reading it: q [B, T, H, K] and dO [B, T, H, V] (user layout, contiguous), gc [B, H, N, C] float32
    and the scale of q."""

    q: torch.Tensor
    do: torch.Tensor
    gate_cumsum: torch.Tensor
    scale: float


def triton_state_pass_backward(
    keys_in, keys_out, chunk_decay, entering_grad, corrections_grad, final_grad, value_dim,
    precision: str | None = None, stored=torch.float32, segment: Segment | None = None, outputs: tuple | None = None,
    from_outputs: OutputsOfChunks | None = None,
):
    """(total corrections gradient [B, H, N, C, V] float32, gradient of each chunk's leaving state [B, H, N, K, V]
    in ``stored``, initial-state gradient [B, H, K, V] float32); None gradients count as zeros; ``precision`` as
    in triton_state_pass_forward. With a ``segment`` the pass starts from ``final_grad`` at the segment's last
    chunk, writes the gradients of its chunks only and returns the gradient of the state entering its first
    chunk as the initial-state gradient. ``outputs``: the three tensors to write into (else new ones). With
    ``from_outputs`` the pass adds each chunk's entering-state gradient from the outputs, formed in the pass, in
    place of ``entering_grad`` (which must then be None)."""
    batch, heads, n_chunks, chunk_size, key_dim = keys_in.shape
    if from_outputs is not None and entering_grad is not None:
        raise ValueError("give the entering-state gradient or the outputs it comes from, not both")
    segment = segment or Segment(0, n_chunks)
    launch = LAUNCH["backward"]
    bk, bv = block_size(key_dim, 256), block_size(value_dim, launch["block_v"])
    device = keys_in.device
    total, leaving, initial_grad = outputs or (
        new_output((batch, heads, n_chunks, chunk_size, value_dim), torch.float32, device),
        new_output((batch, heads, n_chunks, key_dim, value_dim), stored, device),
        new_output((batch, heads, key_dim, value_dim), torch.float32, device),
    )
    grid = (cdiv(value_dim, bv), batch * heads)
    gdn_state_pass_backward_kernel[grid](
        keys_in, keys_out, chunk_decay,
        entering_grad if entering_grad is not None else total,
        corrections_grad if corrections_grad is not None else total,
        final_grad if final_grad is not None else total,
        total, leaving, initial_grad,
        *((from_outputs.q, from_outputs.do, from_outputs.gate_cumsum, from_outputs.scale, from_outputs.q.shape[1])
          if from_outputs is not None else (total, total, total, 1.0, 1)),
        n_chunks, segment.first, segment.stop, H=heads, C=chunk_size, K=key_dim, V=value_dim, BK=bk, BV=bv,
        HAS_ENTERING_GRAD=entering_grad is not None, HAS_CORRECTIONS_GRAD=corrections_grad is not None,
        HAS_FINAL_GRAD=final_grad is not None, HAS_OUTPUTS=from_outputs is not None, INTERPRETED=INTERPRETED,
        PRECISION=precision or launch["precision"],
        **launch_options(launch),
    )
    return total, leaving, initial_grad
