"""Chunked gated delta rule: batched PyTorch around one sequential state pass (kernels/gdn/state_pass.py).

Inside a chunk of C tokens with state S_0 entering it, let gc_t = g_1 + ... + g_t (chunk-local, inclusive)
and D_tj = exp(gc_t - gc_j) for j <= t (0 above the diagonal; every exponent <= 0). Writing the update as
S_t = exp(g_t) S_{t-1} + k_t delta_t^T with delta_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t) and unrolling
it inside the chunk gives the corrections of all its tokens at once (the WY form of DeltaNet):

    (I + diag(beta) A) Delta = diag(beta) V - diag(beta exp(gc)) K S_0,    A_tj = D_tj (k_t . k_j), j < t

so with L = I + diag(beta) A (unit lower triangular), U = L^-1 diag(beta) V and W = L^-1 diag(beta exp(gc)) K,
which do not depend on the state and are solved for every chunk at once,

    Delta = U - W S_0
    O     = scale * diag(exp(gc)) Q S_0 + (D o scale Q K^T) Delta       (D o: elementwise, j <= t)
    S_C   = exp(gc_C) S_0 + (K o exp(gc_C - gc))^T Delta

Only Delta and S_C run chunk after chunk: that state pass is a Python loop over chunks or one Triton kernel
each way (``use_triton``, float32); O is then batched over all chunks. Gradients come from autograd through
the batched operations (``torch.linalg.solve_triangular`` included) and from the state pass's own backward.
Padded tokens of the last chunk have k = v = 0 and beta = g = 0: they change nothing.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common import CHUNK_SIZE, from_chunks, compute_dtype_for, to_chunks
from schedlang.kernels.gdn.state_pass import gated_delta_state_pass


def chunk_gated_delta_rule_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    use_triton: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [B, T, H, V] (v's dtype) and final state [B, H, K, V] (float32/64); differentiable.

    ``use_triton`` runs the state pass as Triton kernels; it needs float32 compute (inputs of 16 or 32 bits).
    """
    dtype = compute_dtype_for(q.dtype)
    queries = to_chunks(q, chunk_size, dtype) * scale
    keys = to_chunks(k, chunk_size, dtype)
    values = to_chunks(v, chunk_size, dtype)
    writes = to_chunks(beta, chunk_size, dtype)[..., None]
    gc = to_chunks(g, chunk_size, dtype).cumsum(-1)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    strictly_lower = (decay * (keys @ keys.transpose(-1, -2))).tril(-1)
    lower = torch.eye(chunk_size, dtype=dtype, device=q.device) + writes * strictly_lower
    right_sides = torch.cat([writes * values, writes * gc.exp()[..., None] * keys], dim=-1)
    solved = torch.linalg.solve_triangular(lower, right_sides, upper=False, unitriangular=True)
    corrections_free, corrections_per_state = solved.split([values.shape[-1], keys.shape[-1]], dim=-1)
    readout = decay * (queries @ keys.transpose(-1, -2))
    entering_queries = queries * gc.exp()[..., None]
    keys_to_end = keys * (gc[..., -1:] - gc).exp()[..., None]
    if use_triton and dtype != torch.float32:
        raise ValueError(f"the Triton state pass computes in float32; inputs of {q.dtype} take the PyTorch one")
    entering_states, corrections, final_state = gated_delta_state_pass(
        corrections_free,
        corrections_per_state,
        keys_to_end,
        gc[..., -1].exp(),
        None if initial_state is None else initial_state.to(dtype),
        use_triton,
    )
    output = from_chunks(entering_queries @ entering_states + readout @ corrections, q.shape[1])
    return output.to(v.dtype), final_state
