"""The gated delta rule over one span of tokens as an affine map of the state entering it.

[Note: gdn span map]
Every token's update ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` is affine in the
state, and so is the whole span: with ``S_in`` the state entering it,

    S_t   = M_t S_in + S_local,t          M_t = A_t ... A_1,   A_t = exp(g_t) (I - beta_t k_t k_t^T)   [K, K]
    o_t   = o_local,t + (scale q_t M_t) S_in
    S_out = M S_in + S_local              M = M_T

where ``S_local,t`` and ``o_local,t`` are the states and outputs from a zero entering state. Chunk by chunk
(kernels/gdn/state_pass.py) the same map reads ``A_n = a_n I - KE_n^T W_n``. Value columns never mix, so one
call of the chunked operator on ``V + K`` value columns gives every term at once: the first ``V`` columns
carry ``v`` from a zero state (``o_local``, ``S_local``), the last ``K`` carry zero values from the identity
(their outputs are ``scale q_t M_t``, their final state is ``M``). A sequence-parallel rank scans the pairs
``(M, S_local)`` across ranks (``schedlang.runtime.scan_common``, :class:`MatrixTransition`) and then forms
its outputs from the ``S_in`` it receives; gradients reach q, k, v, g and beta through autograd of that
call and of the final product with ``S_in``.

Cost: the operator runs once on ``V + K`` columns instead of ``V`` (for ``K = V`` about twice the single
device's work on the span, each way), plus one ``[T, K] x [K, V]`` product per head for the outputs, and the
scan carries ``K * K`` transition numbers per head besides the ``K * V`` state. Nothing runs twice. What
would remove the overhead: finishing from ``S_in`` inside the operator's own phases as GLA does
([Note: span phases]), with ``M`` read from the WY factors by a ``[K, K]`` state pass over the chunks
(the ``K`` extra columns then touch only the state pass, not the output kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedlang.kernels.common import compute_dtype_for
from schedlang.kernels.gdn.chunk import chunk_gated_delta_rule


@dataclass(frozen=True)
class GatedDeltaSpan:
    """The terms of [Note: gdn span map] for one span, in the state dtype (float32, or float64)."""

    local_output: torch.Tensor  # [B, T, H, V]: outputs from a zero entering state
    state_readout: torch.Tensor  # [B, T, H, K]: scale * q_t M_t, each output's linear map of S_in
    local_final_state: torch.Tensor  # [B, H, K, V]: S_local, the final state from a zero entering state
    transition: torch.Tensor  # [B, H, K, K]: M, so that S_out = M @ S_in + S_local

    def output(self, entering_state: torch.Tensor) -> torch.Tensor:
        """The span's outputs ``[B, T, H, V]`` when ``entering_state`` ``[B, H, K, V]`` enters it."""
        return self.local_output + torch.einsum("bthk,bhkv->bthv", self.state_readout, entering_state)


def gated_delta_span(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    backend: str = "auto",
) -> GatedDeltaSpan:
    """The span's affine map ([Note: gdn span map]) from one call of :func:`chunk_gated_delta_rule`.

    Args as that function's (q, k: ``[B, T, H_q, K]``, ``H_q`` dividing ``H``; v: ``[B, T, H, V]``; g, beta:
    ``[B, T, H]``); the terms have v's ``H`` heads. The call
    computes in the state dtype whatever the inputs' dtype, so the terms carry no 16-bit rounding; every
    term is differentiable in q, k, v, g and beta.
    """
    batch, length, _, key_dim = q.shape
    heads, value_dim = v.shape[2], v.shape[3]
    state_dtype = compute_dtype_for(q.dtype)
    identity = torch.eye(key_dim, dtype=state_dtype, device=q.device).expand(batch, heads, key_dim, key_dim)
    entering = torch.cat([identity.new_zeros(batch, heads, key_dim, value_dim), identity], dim=-1)
    values = torch.cat([v.to(state_dtype), v.new_zeros(batch, length, heads, key_dim, dtype=state_dtype)], dim=-1)
    output, final_state = chunk_gated_delta_rule(
        q.to(state_dtype), k.to(state_dtype), values, g, beta, scale=scale, initial_state=entering,
        output_final_state=True, backend=backend,
    )
    local_output, state_readout = output.split([value_dim, key_dim], dim=-1)
    local_final_state, transition = final_state.split([value_dim, key_dim], dim=-1)
    return GatedDeltaSpan(local_output, state_readout, local_final_state, transition)
