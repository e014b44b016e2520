"""Triton kernels shared by the chunked operators: the fused state pass (forward and reverse).

The state pass is split the way ZeCO splits it across devices, here across thread blocks: each program owns
one [BK, BV] block of rows and columns of one head's state (rows are independent: the decay is diagonal),
so a head's state is spread over K/BK x V/BV programs. Walking the chunks in order, a program stores the
state entering chunk n and adds the chunk's update (k * exp(gl - gc))^T v, one matrix product, without
writing the updates to memory; it also computes the gate's chunk-local cumsum from g and writes it for the
intra-chunk kernels. The backward runs the recomputed forward pass and the reverse gradient pass in one
launch, side by side.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


def new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised kernel output, NaN-filled when SCHEDLANG_KERNELS_POISON_OUTPUTS=1 (tests)."""
    if os.environ.get("SCHEDLANG_KERNELS_POISON_OUTPUTS") == "1":
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _state_pass_step(
    x, y, g, gate_cumsum, out, b_state, scale, i_n, i_k, i_v, i_b, i_h, i_bh, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, REVERSE: tl.constexpr, WRITE_CUMSUM: tl.constexpr,
):
    p_out = tl.make_block_ptr(
        out + (i_bh * NT + i_n).to(tl.int64) * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0)
    )
    tl.store(p_out, b_state.to(p_out.dtype.element_ty), boundary_check=(0, 1))
    p_xt = tl.make_block_ptr(x + i_b * T * H * K + i_h * K, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
    p_y = tl.make_block_ptr(y + i_b * T * H * V + i_h * V, (T, V), (H * V, 1), (i_n * BT, i_v * BV), (BT, BV), (1, 0))
    b_xt = tl.load(p_xt, boundary_check=(0, 1), padding_option="zero")
    b_y = tl.load(p_y, boundary_check=(0, 1), padding_option="zero")
    if SCALAR_GATE:
        o_t = i_n * BT + tl.arange(0, BT)
        b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=o_t < T, other=0.0).to(tl.float32)
        b_gc = tl.cumsum(b_g, axis=0)
        b_gl = tl.sum(b_g, axis=0)
        if WRITE_CUMSUM:
            if i_k == 0 and i_v == 0:
                tl.store(gate_cumsum + (i_b * T + o_t) * H + i_h, b_gc, mask=o_t < T)
        if REVERSE:
            b_xt = (b_xt * (tl.exp(b_gc) * scale)[None, :]).to(b_y.dtype)
        else:
            b_xt = (b_xt * tl.exp(b_gl - b_gc)[None, :]).to(b_y.dtype)
        b_state = b_state * tl.exp(b_gl) + tl.dot(b_xt, b_y)
    else:
        p_gt = tl.make_block_ptr(g + i_b * T * H * K + i_h * K, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1))
        b_gt = tl.load(p_gt, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_gct = tl.cumsum(b_gt, axis=1)
        b_gl = tl.sum(b_gt, axis=1)
        if WRITE_CUMSUM:
            if i_v == 0:
                p_gct = tl.make_block_ptr(
                    gate_cumsum + i_b * T * H * K + i_h * K, (K, T), (1, H * K), (i_k * BK, i_n * BT), (BK, BT), (0, 1)
                )
                tl.store(p_gct, b_gct, boundary_check=(0, 1))
        if REVERSE:
            b_xt = (b_xt * tl.exp(b_gct) * scale).to(b_y.dtype)
        else:
            b_xt = (b_xt * tl.exp(b_gl[:, None] - b_gct)).to(b_y.dtype)
        b_state = b_state * tl.exp(b_gl)[:, None] + tl.dot(b_xt, b_y)
    return b_state


@triton.jit
def _state_pass(
    x, y, g, gate_cumsum, out, start_state, end_state, scale, i_k, i_v, i_bh, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, REVERSE: tl.constexpr, HAS_START: tl.constexpr, WRITE_CUMSUM: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # Forward (REVERSE=False): out[n] = S_n, S_{n+1} = exp(gl_n) S_n + (x * exp(gl_n - gc))^T y   (x = k, y = v).
    # Reverse: out[n] = dS_{n+1}, dS_n = exp(gl_n) dS_{n+1} + scale * (x * exp(gc))^T y           (x = q, y = do).
    # Triton 3.6's interpreter cannot take a run-time loop bound in range() under numpy >= 2.4 (it converts
    # a one-element array with int()), so interpreted runs loop with while; compiled runs keep range(),
    # which Triton software-pipelines (the next chunk's loads overlap this chunk's product).
    i_b, i_h = i_bh // H, i_bh % H
    b_state = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_START:
        p_start = tl.make_block_ptr(start_state + i_bh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_state += tl.load(p_start, boundary_check=(0, 1)).to(tl.float32)
    if INTERPRETED:
        step = 0
        while step < NT:
            i_n = NT - 1 - step if REVERSE else step
            b_state = _state_pass_step(
                x, y, g, gate_cumsum, out, b_state, scale, i_n, i_k, i_v, i_b, i_h, i_bh, T, NT,
                H, K, V, BT, BK, BV, SCALAR_GATE, REVERSE, WRITE_CUMSUM,
            )
            step += 1
    else:
        for step in range(NT):
            if REVERSE:
                i_n = NT - 1 - step
            else:
                i_n = step
            b_state = _state_pass_step(
                x, y, g, gate_cumsum, out, b_state, scale, i_n, i_k, i_v, i_b, i_h, i_bh, T, NT,
                H, K, V, BT, BK, BV, SCALAR_GATE, REVERSE, WRITE_CUMSUM,
            )
    p_end = tl.make_block_ptr(end_state + i_bh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_end, b_state, boundary_check=(0, 1))


@triton.jit
def chunk_state_pass_kernel(
    k, v, q, do, g, gate_cumsum, states, initial_state, final_state, state_grads, final_state_grad, initial_grad,
    scale, T, NT, BH,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, REVERSE: tl.constexpr,
    HAS_INITIAL: tl.constexpr, HAS_FINAL_GRAD: tl.constexpr, INTERPRETED: tl.constexpr,
):
    # Programs [0, BH) run the forward state pass; with REVERSE the next BH run the reverse gradient pass:
    # one launch for both passes the backward needs, twice the programs of either.
    i_k, i_v, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if REVERSE and i_z >= BH:
        _state_pass(
            q, do, g, gate_cumsum, state_grads, final_state_grad, initial_grad, scale, i_k, i_v, i_z - BH, T, NT,
            H, K, V, BT, BK, BV, SCALAR_GATE, True, HAS_FINAL_GRAD, False, INTERPRETED,
        )
    else:
        _state_pass(
            k, v, g, gate_cumsum, states, initial_state, final_state, scale, i_k, i_v, i_z, T, NT,
            H, K, V, BT, BK, BV, SCALAR_GATE, False, HAS_INITIAL, True, INTERPRETED,
        )


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def _state_block_v(value_dim: int, programs_per_value_block: int, device: torch.device) -> int:
    """Columns of the state each pass program owns: 32, unless that needs more programs than the GPU has
    multiprocessors (each program is a sequential walk holding one multiprocessor's registers, so a second
    wave would double the pass's time), then 64."""
    block_v = min(32, max(16, triton.next_power_of_2(value_dim)))
    multiprocessors = _multiprocessor_count(device)
    if multiprocessors is not None and programs_per_value_block * triton.cdiv(value_dim, block_v) > multiprocessors:
        block_v = min(64, max(16, triton.next_power_of_2(value_dim)))
    return block_v


def chunk_state_passes(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial_state: torch.Tensor | None,
    states_dtype: torch.dtype,
    chunk_size: int,
    reverse_inputs: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The state pass with the per-chunk update fused in, and the gate's chunk-local cumsum as a by-product.

    Each program owns one [BK, BV] block of the state of one (batch, head) and walks the chunks in order:
    it stores the state entering chunk n, then adds exp(gl_n) * S_n + (k * exp(gl_n - gc))^T v, so the
    per-chunk updates never go through memory. With `reverse_inputs = (q, do, scale, final_state_grad)`
    the same launch also runs the reverse pass dS_n = exp(gl_n) dS_{n+1} + scale (q * exp(gc))^T do.

    Returns (gate_cumsum float32 in g's layout, states [B, H, NT, K, V] in states_dtype, final state
    float32, state gradients [B, H, NT, K, V] (entry n = gradient of the state leaving chunk n) or None,
    d initial_state float32 or None).
    """
    batch, length, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    n_chunks = triton.cdiv(length, chunk_size)
    scalar_gate = g.dim() == 3
    device = k.device
    gate_cumsum = new_output(g.shape, torch.float32, device)
    states = new_output((batch, heads, n_chunks, key_dim, value_dim), states_dtype, device)
    final_state = new_output((batch, heads, key_dim, value_dim), torch.float32, device)
    passes = 1 if reverse_inputs is None else 2
    block_k = min(64, max(16, triton.next_power_of_2(key_dim)))
    block_v = _state_block_v(value_dim, passes * batch * heads * triton.cdiv(key_dim, block_k), device)
    q = do = final_state_grad = state_grads = initial_grad = None
    scale = 1.0
    if reverse_inputs is not None:
        q, do, scale, final_state_grad = reverse_inputs
        state_grads = new_output(states.shape, states_dtype, device)
        initial_grad = new_output(final_state.shape, torch.float32, device)
    grid = (triton.cdiv(key_dim, block_k), triton.cdiv(value_dim, block_v), passes * batch * heads)
    chunk_state_pass_kernel[grid](
        k, v, q if q is not None else k, do if do is not None else v, g, gate_cumsum, states,
        initial_state.contiguous() if initial_state is not None else final_state, final_state,
        state_grads if state_grads is not None else states,
        final_state_grad.contiguous() if final_state_grad is not None else final_state,
        initial_grad if initial_grad is not None else final_state,
        scale, length, n_chunks, batch * heads,
        H=heads, K=key_dim, V=value_dim, BT=chunk_size, BK=block_k, BV=block_v,
        SCALAR_GATE=scalar_gate, REVERSE=reverse_inputs is not None,
        HAS_INITIAL=initial_state is not None, HAS_FINAL_GRAD=final_state_grad is not None,
        INTERPRETED=INTERPRETED, num_warps=8, num_stages=2,
    )
    return gate_cumsum, states, final_state, state_grads, initial_grad
