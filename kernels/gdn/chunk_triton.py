"""Triton chunked gated delta rule: host functions and the autograd Function of the Triton backend.

Forward (kernels/gdn/README.md derives every step): the WY solve per chunk (gc, exp(gc_C) and
T = (I + A)^-1), the WY products (U, W, KE), the chunk-after-chunk state pass (kernels/gdn/state_pass_triton.py:
each chunk's entering state S_n and corrections Delta_n, the final state), then the outputs. Backward: the WY
products again, the state pass again unless the forward kept its states (``save_states``), the outputs'
state-free gradients, the backward state pass, and one kernel per chunk for dq, dk, dv, dbeta and dg.

The forward keeps gc, the chunk decays and T for the backward (T is [B, H, N, 64, 64] float32: 64 values per
token and head); with ``save_states`` also S_n and Delta_n ([B, H, N, K, V] and [B, H, N, 64, V]). Those, U, W,
KE and the leaving-state gradients are stored in the states' dtype (kernels/common/sizes.py: 16 bits for
16-bit inputs, else float32); every product accumulates in float32 (kernels/gdn/README.md, "Precision").

The host functions launch over a range of kernel chunks (a ``Segment``, all chunks by default) and can write
into tensors made for every chunk, so the launch table's "overlap" entry can run the forward and the backward
as two segments whose state passes run beside the other segment's per-chunk work ([Note: gdn overlap]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedlang.kernels.common.arguments import CHUNK_SIZE
from schedlang.kernels.common.heads import repeat_each_head, sum_each_head_group
from schedlang.kernels.common.sizes import block_size, cdiv, launch_options, states_dtype
from schedlang.kernels.common.sizes import products_precision as table_products_precision
from schedlang.kernels.common.triton_scan import new_output
from schedlang.kernels.gdn.overlap import Lanes, Segment, split_into_segments
from schedlang.kernels.gdn.state_pass_triton import (
    LAUNCH, OutputsOfChunks, triton_state_pass_backward, triton_state_pass_forward,
)
from schedlang.kernels.gdn.triton_backward import gdn_bwd_kernel_chunk, gdn_bwd_kernel_key_block, gdn_bwd_kernel_wy_block
from schedlang.kernels.gdn.triton_output import gdn_bwd_kernel_output_terms, gdn_fwd_kernel_output
from schedlang.kernels.gdn.triton_wy import gdn_fwd_kernel_wy_apply, gdn_fwd_kernel_wy_solve

CHUNK = CHUNK_SIZE
SUB_CHUNK = 16
"""The edge of the diagonal blocks the solve inverts by forward substitution (CHUNK // SUB_CHUNK = 4 of them)."""


def products_precision(dtype: torch.dtype) -> str:
    """The input precision of the per-chunk kernels' products for inputs of ``dtype``."""
    return table_products_precision(LAUNCH, dtype)


def state_pass_precision(dtype: torch.dtype) -> str | None:
    """The state pass's input precision for inputs of ``dtype``: its own table entry's for float32 inputs (None);
    16-bit inputs give it 16-bit operands, whose products take the per-chunk kernels' setting."""
    return None if dtype == torch.float32 else products_precision(dtype)


@dataclass(frozen=True)
class SolvedChunks:
    """What the WY solve leaves, chunk by chunk: gc [B, H, N, C], exp(gc_C) [B, H, N] and T [B, H, N, C, C],
    float32."""

    gate_cumsum: torch.Tensor
    chunk_decay: torch.Tensor
    inverse: torch.Tensor


def _sizes(q_or_k: torch.Tensor, v: torch.Tensor) -> dict:
    batch, length, heads, key_dim = q_or_k.shape
    return dict(T=length, N=cdiv(length, CHUNK), H=heads, K=key_dim, V=v.shape[-1], C=CHUNK)


def new_solved_chunks(k: torch.Tensor) -> SolvedChunks:
    """Unwritten SolvedChunks for every kernel chunk of ``k`` [B, T, H, K]."""
    batch, length, heads, _ = k.shape
    n_chunks = cdiv(length, CHUNK)
    return SolvedChunks(
        new_output((batch, heads, n_chunks, CHUNK), torch.float32, k.device),
        new_output((batch, heads, n_chunks), torch.float32, k.device),
        new_output((batch, heads, n_chunks, CHUNK, CHUNK), torch.float32, k.device),
    )


def solve_chunks(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, segment: Segment | None = None,
                 solved: SolvedChunks | None = None) -> SolvedChunks:
    """gc, the chunk decays and T = (I + A)^-1 of every chunk of ``segment`` (all chunks if None), from one
    launch, written into ``solved`` (else new tensors)."""
    batch, length, heads, key_dim = k.shape
    n_chunks = cdiv(length, CHUNK)
    segment = segment or Segment(0, n_chunks)
    solved = solved or new_solved_chunks(k)
    launch = LAUNCH["wy_solve"]
    gdn_fwd_kernel_wy_solve[(segment.count, batch * heads)](
        k, g, beta, solved.gate_cumsum, solved.chunk_decay, solved.inverse, length, n_chunks, segment.first,
        H=heads, K=key_dim, C=CHUNK, BC=SUB_CHUNK, BK=block_size(key_dim, launch["block_k"]),
        PRECISION=products_precision(k.dtype), **launch_options(launch),
    )
    return solved


def new_wy_products(k, v, with_updates: bool = True):
    """Unwritten (U or None, W, KE) for every kernel chunk, in the layout and dtype apply_inverse writes."""
    sizes = _sizes(k, v)
    chunked = (k.shape[0], sizes["H"], sizes["N"], CHUNK)
    stored = states_dtype(k.dtype)
    updates = new_output(chunked + (sizes["V"],), stored, k.device) if with_updates else None
    keys_in, keys_out = (new_output(chunked + (sizes["K"],), stored, k.device) for _ in range(2))
    return updates, keys_in, keys_out


def apply_inverse(k, v, beta, solved: SolvedChunks, with_updates: bool = True, segment: Segment | None = None,
                  outputs: tuple | None = None):
    """(U [B, H, N, C, V] or None without ``with_updates``, W [B, H, N, C, K], KE [B, H, N, C, K]) in the
    states' dtype (kernels/common/sizes.py: 16 bits for 16-bit inputs), for the chunks of ``segment`` (all if
    None), written into ``outputs`` (else new tensors, as new_wy_products makes them)."""
    sizes = _sizes(k, v)
    batch, n_chunks = k.shape[0], sizes["N"]
    segment = segment or Segment(0, n_chunks)
    updates, keys_in, keys_out = outputs or new_wy_products(k, v, with_updates)
    launch = LAUNCH["wy_apply"]
    gdn_fwd_kernel_wy_apply[(segment.count, batch * sizes["H"])](
        k, v, beta, solved.gate_cumsum, solved.inverse, updates if with_updates else keys_in, keys_in, keys_out,
        sizes["T"], n_chunks, segment.first, H=sizes["H"], K=sizes["K"], V=sizes["V"], C=CHUNK,
        BK=block_size(sizes["K"], launch["block_k"]), BV=block_size(sizes["V"], launch["block_v"]),
        PRECISION=products_precision(k.dtype), UPDATES=with_updates, **launch_options(launch),
    )
    return updates, keys_in, keys_out


def chunk_output(q, k, v, solved: SolvedChunks, states, corrections, scale: float, segment: Segment | None = None,
                 output: torch.Tensor | None = None) -> torch.Tensor:
    """o [B, T, H, V] in v's dtype from the states entering the chunks and the corrections: the tokens of the
    chunks of ``segment`` (all if None), written into ``output`` (else a new tensor)."""
    sizes = _sizes(q, v)
    batch, heads = q.shape[0], sizes["H"]
    segment = segment or Segment(0, sizes["N"])
    output = new_output(v.shape, v.dtype, v.device) if output is None else output
    launch = LAUNCH["output"]
    block_v = block_size(sizes["V"], launch["block_v"])
    gdn_fwd_kernel_output[(cdiv(sizes["V"], block_v), segment.count, batch * heads)](
        q, k, solved.gate_cumsum, states, corrections, output, scale, sizes["T"], sizes["N"], segment.first,
        H=heads, K=sizes["K"], V=sizes["V"], C=CHUNK, BK=block_size(sizes["K"], launch["block_k"]), BV=block_v,
        PRECISION=products_precision(q.dtype), **launch_options(launch),
    )
    return output


def state_pass_forms_output_terms(dtype: torch.dtype) -> bool:
    """Whether the backward state pass forms the outputs' entering-state gradients itself for inputs of ``dtype``:
    the launch table's backward "output_terms", for 16-bit inputs only (float32 q tiles overflow the pass's shared
    memory at its stages)."""
    return bool(LAUNCH["backward"]["output_terms"]) and dtype in (torch.float16, torch.bfloat16)


def output_gradients(q, k, v, do, solved: SolvedChunks, scale: float):
    """(the outputs' gradients of each chunk's entering state [B, H, N, K, V], or None when the backward state
    pass forms them itself (the launch table's "backward" "output_terms"), and of each chunk's corrections
    [B, H, N, C, V]), float32; the second item of the pair is what that state pass then takes."""
    sizes = _sizes(q, v)
    batch, heads, n_chunks = q.shape[0], sizes["H"], sizes["N"]
    in_state_pass = state_pass_forms_output_terms(q.dtype)
    corrections_grad = new_output((batch, heads, n_chunks, CHUNK, sizes["V"]), torch.float32, q.device)
    entering_grad = None if in_state_pass else new_output(
        (batch, heads, n_chunks, sizes["K"], sizes["V"]), torch.float32, q.device
    )
    launch = LAUNCH["output_gradients"]
    gdn_bwd_kernel_output_terms[(n_chunks, batch * heads)](
        q, k, do, solved.gate_cumsum, corrections_grad if in_state_pass else entering_grad, corrections_grad, scale,
        sizes["T"], n_chunks, 0, H=heads, K=sizes["K"], V=sizes["V"], C=CHUNK,
        BK=block_size(sizes["K"], launch["block_k"]), BV=block_size(sizes["V"], launch["block_v"]),
        PRECISION=products_precision(q.dtype), STATE_TERMS=not in_state_pass, **launch_options(launch),
    )
    from_outputs = OutputsOfChunks(q, do, solved.gate_cumsum, scale) if in_state_pass else None
    return (entering_grad, from_outputs), corrections_grad


@dataclass(frozen=True)
class GradientBuffers:
    """What chunk_gradients writes, for every kernel chunk: the gradients (dq in q's dtype, dk float32, dv in v's
    dtype, dbeta and dg float32, user layout), each chunk's [C, C] float32 scratch slot and, when the launch table
    splits the per-chunk backward, the key blocks' partial dT, dbeta and dgc ([key blocks * B * H * N, ...]);
    None when it is fused."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dbeta: torch.Tensor
    dg: torch.Tensor
    scratch: torch.Tensor
    partial_dt: torch.Tensor | None
    partial_dbeta: torch.Tensor | None
    partial_dgc: torch.Tensor | None


def new_gradient_buffers(q, k, v, beta) -> GradientBuffers:
    """Unwritten GradientBuffers for every kernel chunk, laid out for the launch table's "chunk_gradients"."""
    sizes = _sizes(q, v)
    launch = LAUNCH["chunk_gradients"]
    shares = cdiv(sizes["K"], block_size(sizes["K"], launch["block_k"])) * q.shape[0] * sizes["H"] * sizes["N"]

    def partial(*shape):
        return torch.empty((shares, *shape), dtype=torch.float32, device=q.device) if launch["split"] else None

    return GradientBuffers(
        new_output(q.shape, q.dtype, q.device),
        new_output(k.shape, torch.float32, k.device),
        new_output(v.shape, v.dtype, v.device),
        new_output(beta.shape, torch.float32, beta.device),
        new_output(beta.shape, torch.float32, beta.device),
        torch.empty((q.shape[0], sizes["H"], sizes["N"], CHUNK, CHUNK), dtype=torch.float32, device=q.device),
        partial(CHUNK, CHUNK),
        partial(CHUNK),
        partial(CHUNK),
    )


def chunk_gradients(q, k, v, beta, do, solved: SolvedChunks, states, leaving_grad, corrections, corrections_grad, scale,
                    segment: Segment | None = None, buffers: GradientBuffers | None = None):
    """(dq in q's dtype, dk float32, dv in v's dtype, dbeta float32, dg float32), user layout: the tokens of the
    chunks of ``segment`` (all if None), written into ``buffers`` (else new ones)."""
    sizes = _sizes(q, v)
    batch, heads, n_chunks = q.shape[0], sizes["H"], sizes["N"]
    segment = segment or Segment(0, n_chunks)
    buffers = buffers or new_gradient_buffers(q, k, v, beta)
    launch = LAUNCH["chunk_gradients"]
    blocks = dict(
        H=heads, K=sizes["K"], V=sizes["V"], C=CHUNK, BK=block_size(sizes["K"], launch["block_k"]),
        BV=block_size(sizes["V"], launch["block_v"]), PRECISION=products_precision(q.dtype), **launch_options(launch),
    )
    gradients = (buffers.dq, buffers.dk, buffers.dv, buffers.dbeta, buffers.dg)
    if buffers.partial_dt is None:
        gdn_bwd_kernel_chunk[(segment.count, batch * heads)](
            q, k, v, beta, do, solved.gate_cumsum, solved.inverse, states, leaving_grad, corrections, corrections_grad,
            *gradients, buffers.scratch, scale, sizes["T"], n_chunks, segment.first, **blocks,
        )
        return gradients
    partials = (buffers.partial_dt, buffers.partial_dbeta, buffers.partial_dgc)
    gdn_bwd_kernel_key_block[(cdiv(sizes["K"], blocks["BK"]), segment.count, batch * heads)](
        q, k, beta, do, solved.gate_cumsum, solved.inverse, states, leaving_grad, corrections, corrections_grad,
        buffers.dq, buffers.dk, *partials, scale, sizes["T"], n_chunks, segment.first, **blocks,
        STORED_OPERANDS=value_operands_as_stored(launch, do, states, leaving_grad, corrections),
        TRANSPOSE_SCORES=bool(launch["transpose_scores"]),
    )
    gdn_bwd_kernel_wy_block[(segment.count, batch * heads)](
        k, v, beta, solved.gate_cumsum, solved.inverse, corrections_grad, buffers.dk, buffers.dv, buffers.dbeta,
        buffers.dg, *partials, buffers.scratch, sizes["T"], n_chunks, segment.first, **blocks,
    )
    return gradients


def value_operands_as_stored(launch: dict, *operands: torch.Tensor) -> bool:
    """Whether the split backward's value-loop products take their operands as stored: when the launch entry's
    "value_operands" asks for it and they share one 16-bit dtype (float32 operands take float32 either way)."""
    dtypes = {operand.dtype for operand in operands}
    return launch["value_operands"] == "stored" and len(dtypes) == 1 and dtypes != {torch.float32}


def _float32(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(torch.float32).contiguous()


def overlap_segments(length: int) -> tuple[Segment, ...]:
    """The kernel-chunk segments the launch table's "overlap" entry asks for, for a call of ``length`` tokens."""
    launch = LAUNCH["overlap"]
    return split_into_segments(cdiv(length, CHUNK), launch["segments"], launch["split"])


# [Note: gdn overlap]
# StateFlow's state-transition overlap (section 3.4.2, Eq. 17-18). The state pass walks the kernel chunks one
# after another with only B * H * V / BV programs, so it leaves most of the GPU idle; the per-chunk kernels
# around it launch a program per chunk and can fill the rest. With the launch table's "overlap" at 2 segments
# the kernel chunks split into a first segment E = [0, s) and a second L = [s, N), and the state pass of one
# segment runs on a side stream beside per-chunk work of the other (Lanes, kernels/gdn/overlap.py):
#
#   forward   Pre(E) -> ST(E) || Pre(L) -> ST(L) || Out(E) -> Out(L)                           (Eq. 17)
#   backward  Pre'(all) -> SR(all) || [OG(all) -> STB(L)] -> PG(L) || STB(E) -> PG(E)         (Eq. 18)
#
# Pre is the WY solve and apply, ST the forward state pass, Out the outputs; Pre' the WY products again, SR the
# state replay (the forward state pass rerun when the forward kept no states), OG the outputs' state-free
# gradients, STB the backward state pass (in reverse: L before E), PG the per-chunk gradients. Every arrow is a
# data dependency the schedule keeps with stream order or an event: ST(L) starts from the state ST(E) leaves,
# STB(E) from the gradient STB(L) leaves for the state entering L, Out and PG of a segment after its state
# pass (and PG after SR). It is exact: each per-chunk kernel computes a chunk from the same operands whatever
# the segment, and the state and its gradient cross the segment boundary as the float32 values the one-segment
# pass keeps in registers there, so both schedules perform the same arithmetic. On a CPU (the interpreter)
# the same steps run in the order written, on one stream. Every tensor a side-stream step touches is allocated
# on the caller's stream before the step is issued and referenced until the join (Lanes' memory contract).


def overlapped_forward(q, k, v, g, beta, initial_state, scale: float, segments: tuple[Segment, Segment]):
    """(o, final state, SolvedChunks, entering states, corrections) as the one-segment forward computes them, by
    the two-segment schedule of [Note: gdn overlap]."""
    first, second = segments
    lanes = Lanes(q.device)
    solved = new_solved_chunks(k)
    products = new_wy_products(k, v)
    updates, keys_in, keys_out = products
    stored, precision = states_dtype(k.dtype), state_pass_precision(k.dtype)
    batch, heads, n_chunks, _, key_dim = keys_in.shape
    states = new_output((batch, heads, n_chunks, key_dim, v.shape[-1]), stored, v.device)
    corrections = new_output(updates.shape, stored, v.device)
    state_shape = (batch, heads, key_dim, v.shape[-1])
    boundary_state, final_state = (new_output(state_shape, torch.float32, v.device) for _ in range(2))
    entering_state = _float32(initial_state)

    def prepare(segment):
        solve_chunks(k, g, beta, segment, solved)
        apply_inverse(k, v, beta, solved, segment=segment, outputs=products)

    def state_pass(segment, state_in, state_out):
        return lambda: triton_state_pass_forward(
            updates, keys_in, keys_out, solved.chunk_decay, state_in, precision, stored, segment,
            (states, corrections, state_out),
        )

    prepare(first)
    _, first_passed = lanes.beside(state_pass(first, entering_state, boundary_state))
    prepare(second)
    lanes.beside(state_pass(second, boundary_state, final_state))
    lanes.wait(first_passed)
    output = chunk_output(q, k, v, solved, states, corrections, scale, first)
    lanes.join()
    chunk_output(q, k, v, solved, states, corrections, scale, second, output)
    return output, final_state, solved, states, corrections


def overlapped_backward(q, k, v, beta, initial_state, states, corrections, solved: SolvedChunks, do, final_state_grad,
                        scale: float, segments: tuple[Segment, Segment]):
    """(dq, dk float32, dv, dbeta float32, dg float32, initial-state gradient float32) as the one-segment
    backward computes them, by the two-segment schedule of [Note: gdn overlap]; ``states`` and ``corrections``
    are the forward's, or None to replay them."""
    first, second = segments
    lanes = Lanes(q.device)
    stored, precision = states_dtype(k.dtype), state_pass_precision(k.dtype)
    replay = states is None
    updates, keys_in, keys_out = apply_inverse(k, v, beta, solved, with_updates=replay)
    batch, heads, n_chunks, _, key_dim = keys_in.shape
    value_dim = v.shape[-1]
    replayed = None
    if replay:
        states = new_output((batch, heads, n_chunks, key_dim, value_dim), stored, v.device)
        corrections = new_output(updates.shape, stored, v.device)
        replay_final = new_output((batch, heads, key_dim, value_dim), torch.float32, v.device)
        entering_state = _float32(initial_state)
        _, replayed = lanes.beside(lambda: triton_state_pass_forward(
            updates, keys_in, keys_out, solved.chunk_decay, entering_state, precision, stored, None,
            (states, corrections, replay_final),
        ))
    (entering_grad, from_outputs), corrections_grad = output_gradients(q, k, v, do, solved, scale)
    total = new_output((batch, heads, n_chunks, CHUNK, value_dim), torch.float32, v.device)
    leaving = new_output((batch, heads, n_chunks, key_dim, value_dim), stored, v.device)
    state_shape = (batch, heads, key_dim, value_dim)
    boundary_grad, initial_grad = (new_output(state_shape, torch.float32, v.device) for _ in range(2))

    def state_pass_backward(segment, grad_out, grad_in):
        triton_state_pass_backward(
            keys_in, keys_out, solved.chunk_decay, entering_grad, corrections_grad, grad_out, value_dim, precision,
            stored, segment, (total, leaving, grad_in), from_outputs,
        )

    buffers = new_gradient_buffers(q, k, v, beta)

    def gradients(segment):
        return lambda: chunk_gradients(
            q, k, v, beta, do, solved, states, leaving, corrections, total, scale, segment, buffers
        )

    state_pass_backward(second, _float32(final_state_grad), boundary_grad)
    lanes.beside(gradients(second))
    state_pass_backward(first, boundary_grad, initial_grad)
    lanes.wait(replayed)
    gradients(first)()
    lanes.join()
    return buffers.dq, buffers.dk, buffers.dv, buffers.dbeta, buffers.dg, initial_grad


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    """``(q, k, v, g, beta, initial_state or None, scale, save_states)`` -> ``(o, final state)``; inputs of 16 or 32
    bits, contiguous, on one CUDA device (or the interpreter). Gradients flow to the first six. The launch
    table's "overlap" entry picks the schedule of the forward and, separately, of the backward.

    q and k may have fewer heads than v (grouped value heads): the kernels read them repeated to v's heads
    (:func:`repeat_each_head`), a copy made in the forward and again in the backward and freed after each, so
    only the narrow q and k are kept between the two; their gradients are summed back over each group."""

    @staticmethod
    def forward(ctx, narrow_q, narrow_k, v, g, beta, initial_state, scale, save_states):
        ctx.set_materialize_grads(False)
        q, k = repeat_each_head(narrow_q, v.shape[2]), repeat_each_head(narrow_k, v.shape[2])
        segments = overlap_segments(q.shape[1])
        if len(segments) == 2:
            output, final_state, solved, states, corrections = overlapped_forward(
                q, k, v, g, beta, initial_state, scale, segments
            )
        else:
            solved = solve_chunks(k, g, beta)
            updates, keys_in, keys_out = apply_inverse(k, v, beta, solved)
            states, corrections, final_state = triton_state_pass_forward(
                updates, keys_in, keys_out, solved.chunk_decay, _float32(initial_state),
                state_pass_precision(k.dtype), states_dtype(k.dtype),
            )
            output = chunk_output(q, k, v, solved, states, corrections, scale)
        kept = (states, corrections) if save_states else (None, None)
        ctx.save_for_backward(
            narrow_q, narrow_k, v, g, beta, initial_state, *kept, solved.gate_cumsum, solved.chunk_decay, solved.inverse
        )
        ctx.scale = scale
        return output, final_state

    @staticmethod
    def backward(ctx, output_grad, final_state_grad):
        narrow_q, narrow_k, v, g, beta, initial_state, states, corrections, *solved_tensors = ctx.saved_tensors
        q, k = repeat_each_head(narrow_q, v.shape[2]), repeat_each_head(narrow_k, v.shape[2])
        groups = v.shape[2] // narrow_q.shape[2]
        solved = SolvedChunks(*solved_tensors)
        do = torch.zeros_like(v) if output_grad is None else output_grad.contiguous()
        segments = overlap_segments(q.shape[1])
        if len(segments) == 2:
            dq, dk, dv, dbeta, dg, initial_grad = overlapped_backward(
                q, k, v, beta, initial_state, states, corrections, solved, do, final_state_grad, ctx.scale, segments
            )
        else:
            saved = states is not None
            updates, keys_in, keys_out = apply_inverse(k, v, beta, solved, with_updates=not saved)
            if not saved:
                states, corrections, _ = triton_state_pass_forward(
                    updates, keys_in, keys_out, solved.chunk_decay, _float32(initial_state),
                    state_pass_precision(k.dtype), states_dtype(k.dtype),
                )
            (entering_grad, from_outputs), corrections_grad = output_gradients(q, k, v, do, solved, ctx.scale)
            total, leaving, initial_grad = triton_state_pass_backward(
                keys_in, keys_out, solved.chunk_decay, entering_grad, corrections_grad, _float32(final_state_grad),
                v.shape[-1], state_pass_precision(k.dtype), states_dtype(k.dtype), from_outputs=from_outputs,
            )
            dq, dk, dv, dbeta, dg = chunk_gradients(
                q, k, v, beta, do, solved, states, leaving, corrections, total, ctx.scale
            )
        d_initial = None if initial_state is None else initial_grad.to(initial_state.dtype)
        if groups > 1:  # each q/k head's gradient: the sum over the value heads it served, in float32
            dq = sum_each_head_group(dq.float(), groups).to(q.dtype)
            dk = sum_each_head_group(dk, groups)
        return dq, dk.to(k.dtype), dv, dg.to(g.dtype), dbeta.to(beta.dtype), d_initial, None, None


def triton_chunk_gated_delta_rule(q, k, v, g, beta, scale: float, initial_state, save_states: bool):
    """(o [B, T, H, V] in v's dtype, final state [B, H, K, V] float32) through ChunkGatedDeltaRuleFunction (q and k
    [B, T, H_q, K], ``H_q`` dividing ``H``)."""
    q, k, v, g, beta = (tensor.contiguous() for tensor in (q, k, v, g, beta))
    return ChunkGatedDeltaRuleFunction.apply(q, k, v, g, beta, initial_state, scale, save_states)
