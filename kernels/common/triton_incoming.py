"""Triton pieces that let a chunked operator finish from a state that arrives after its scan.

A sequence-parallel rank scans its chunks from a zero state while the state entering its span is still on its
way ([Note: span phases] in function.py). Its stored chunk states are then local, and the true ones are

    S_n = S_n^local + exp(P_n) * S_in          P_n = sum of the chunk log decays of chunks 0 .. n-1
    dS_n = dS_n^local + exp(Q_n) * dS_out      Q_n = sum of the chunk log decays of chunks n+1 .. NT-1

for the state entering chunk n and the gradient of the state leaving it. Rather than rewrite every stored
state, the kernels that read a state tile add the incoming term as they load it (``add_incoming``), from one
``[K, V]`` incoming tensor and a per-chunk log weight: one extra small load per tile, no extra pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.sizes import block_size, cdiv
from schedlang.kernels.common.triton_scan import new_output


@triton.jit
def add_incoming(
    b_tile, incoming, log_weight, i_bh, i_n, NT, key_start, value_start,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SCALAR_GATE: tl.constexpr, TRANSPOSED: tl.constexpr,
):
    """``b_tile + exp(log_weight[chunk i_n, keys]) * incoming[keys, values]`` in b_tile's dtype (summed in float32),
    for the keys from key_start and the values from value_start; b_tile is ``[BK, BV]``, or ``[BV, BK]`` when
    TRANSPOSED. ``incoming`` is ``[BH, K, V]`` float32, ``log_weight`` ``[BH, NT, K]`` (``[BH, NT]`` for a scalar
    gate)."""
    o_k = key_start + tl.arange(0, BK)
    o_v = value_start + tl.arange(0, BV)
    if SCALAR_GATE:
        b_weight = tl.exp(tl.load(log_weight + i_bh * NT + i_n) + tl.zeros([BK], dtype=tl.float32))
    else:
        b_weight = tl.exp(tl.load(log_weight + (i_bh * NT + i_n) * K + o_k, mask=o_k < K, other=0.0))
    base = incoming + i_bh * K * V
    if TRANSPOSED:
        mask = (o_v[:, None] < V) & (o_k[None, :] < K)
        b_incoming = tl.load(base + o_k[None, :] * V + o_v[:, None], mask=mask, other=0.0)
        b_sum = b_tile.to(tl.float32) + b_weight[None, :] * b_incoming
    else:
        mask = (o_k[:, None] < K) & (o_v[None, :] < V)
        b_incoming = tl.load(base + o_k[:, None] * V + o_v[None, :], mask=mask, other=0.0)
        b_sum = b_tile.to(tl.float32) + b_weight[:, None] * b_incoming
    return b_sum.to(b_tile.dtype)


@triton.jit
def chunk_gate_sums_kernel(
    chunk_gate, prefix, suffix, total, NT,
    K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    # One program per (key block, batch * head): walks the chunks in blocks of BN, forward for the exclusive
    # prefix (and the total), then backward for the exclusive suffix, each sum formed within a block and
    # carried across blocks, so no difference of two long sums is ever taken.
    i_k, i_bh = tl.program_id(0), tl.program_id(1)
    o_k = i_k * BK + tl.arange(0, BK)
    o_n = tl.arange(0, BN)
    carry = tl.zeros([BK], dtype=tl.float32)
    n_blocks = tl.cdiv(NT, BN)
    block = 0
    while block < n_blocks:
        rows = block * BN + o_n
        offsets = (i_bh * NT + rows[:, None]) * K + o_k[None, :]
        mask = (rows[:, None] < NT) & (o_k[None, :] < K)
        b_gate = tl.load(chunk_gate + offsets, mask=mask, other=0.0)
        b_inclusive = tl.cumsum(b_gate, axis=0)
        tl.store(prefix + offsets, b_inclusive - b_gate + carry[None, :], mask=mask)
        carry += tl.sum(b_gate, axis=0)
        block += 1
    tl.store(total + i_bh * K + o_k, carry, mask=o_k < K)
    carry = tl.zeros([BK], dtype=tl.float32)
    block = n_blocks - 1
    while block >= 0:
        rows = block * BN + o_n
        offsets = (i_bh * NT + rows[:, None]) * K + o_k[None, :]
        mask = (rows[:, None] < NT) & (o_k[None, :] < K)
        b_gate = tl.load(chunk_gate + offsets, mask=mask, other=0.0)
        b_inclusive = tl.cumsum(b_gate, axis=0)
        b_block_sum = tl.sum(b_gate, axis=0)
        tl.store(suffix + offsets, b_block_sum[None, :] - b_inclusive + carry[None, :], mask=mask)
        carry += b_block_sum
        block -= 1


def chunk_gate_sums(chunk_gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(P, Q, total) of the per-chunk log decays ``[B, H, NT, K]`` (or ``[B, H, NT]``), float32: the exclusive
    prefix P_n and suffix Q_n along the chunks (module docstring), each of chunk_gate's shape, and the sum over
    all chunks, ``[B, H, K]`` (or ``[B, H]``)."""
    chunk_gate = chunk_gate.contiguous()
    batch, heads, n_chunks = chunk_gate.shape[:3]
    key_dim = chunk_gate.shape[3] if chunk_gate.dim() == 4 else 1
    prefix = new_output(chunk_gate.shape, torch.float32, chunk_gate.device)
    suffix = new_output(chunk_gate.shape, torch.float32, chunk_gate.device)
    total = new_output(chunk_gate.shape[:2] + chunk_gate.shape[3:], torch.float32, chunk_gate.device)
    block_k = block_size(key_dim, 64)
    chunk_gate_sums_kernel[(cdiv(key_dim, block_k), batch * heads)](
        chunk_gate, prefix, suffix, total, n_chunks, K=key_dim, BN=64, BK=block_k,
    )
    return prefix, suffix, total


@dataclass(frozen=True)
class IncomingTerms:
    """The incoming state and final-state gradient a finish adds on load, with their per-chunk log weights.

    ``state`` (S_in) pairs with ``state_weight`` (P), ``grad`` (dS_out) with ``grad_weight`` (Q); either pair is
    None when absent. ``total`` is the span's summed log decay, for ``gamma = exp(total)``.
    """

    state: torch.Tensor | None
    state_weight: torch.Tensor | None
    grad: torch.Tensor | None
    grad_weight: torch.Tensor | None
    total: torch.Tensor | None

    @classmethod
    def of(cls, chunk_gate: torch.Tensor, state: torch.Tensor | None = None, grad: torch.Tensor | None = None) -> "IncomingTerms":
        if state is None and grad is None:
            return cls(None, None, None, None, None)
        prefix, suffix, total = chunk_gate_sums(chunk_gate)
        as_float = lambda tensor: None if tensor is None else tensor.to(torch.float32).contiguous()  # noqa: E731
        return cls(
            as_float(state), prefix if state is not None else None, as_float(grad), suffix if grad is not None else None, total
        )

    def state_args(self, placeholder: torch.Tensor) -> dict:
        """The kernels' incoming-state arguments (placeholder pointers when there is none)."""
        present = self.state is not None
        return dict(
            incoming_state=self.state if present else placeholder,
            state_weight=self.state_weight if present else placeholder,
            CORRECT_STATES=present,
        )

    def grad_args(self, placeholder: torch.Tensor) -> dict:
        """The kernels' incoming-gradient arguments (placeholder pointers when there is none)."""
        present = self.grad is not None
        return dict(
            incoming_grad=self.grad if present else placeholder,
            grad_weight=self.grad_weight if present else placeholder,
            CORRECT_GRADS=present,
        )

    def decayed(self, tensor: torch.Tensor) -> torch.Tensor:
        """``exp(total) * tensor`` for a ``[B, H, K, V]`` tensor: what it becomes across the whole span."""
        gamma = self.total.exp()
        gamma = gamma[:, :, None, None] if gamma.dim() == 2 else gamma[..., None]
        return gamma * tensor
