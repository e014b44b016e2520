"""The token embedding, with a backward that never makes the host wait for the GPU.

[Note: embedding backward without a host sync]
PyTorch's CUDA embedding backward sorts the token ids and reads the number of distinct ids back to the host
before it launches its last kernels: one device-to-host copy, so one full drain of the GPU's queue, in every
chunk's backward on the first stage. Under a chunked schedule the host then has to queue the next chunk's whole
backward while the GPU idles. :class:`TokenEmbedding` keeps ``nn.Embedding``'s parameter, name and forward, and
forms the weight gradient with ``index_add_`` instead, which runs on the device only. The sum is accumulated in
float32 for half-precision weights (as PyTorch's kernel accumulates in its accumulate type) and in the weight's
own dtype otherwise, then cast to the weight's dtype; the order of the additions is the GPU's, so the gradient is
equal to PyTorch's within float32 rounding, not bit for bit. ``benchmarks/profile_stage.py --sync-debug`` shows
the drain (docs/benchmarks.md, "Where the step's time goes").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _TokenLookup(torch.autograd.Function):
    """``weight[token_ids]`` forward; the weight gradient by ``index_add_`` (no host sync)."""

    @staticmethod
    def forward(ctx, token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(token_ids)
        ctx.weight_shape = weight.shape
        ctx.weight_dtype = weight.dtype
        return F.embedding(token_ids, weight)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[None, torch.Tensor]:
        (token_ids,) = ctx.saved_tensors
        accumulate = _accumulation_dtype(ctx.weight_dtype)
        grad_weight = torch.zeros(ctx.weight_shape, dtype=accumulate, device=grad_output.device)
        rows = grad_output.reshape(-1, ctx.weight_shape[1]).to(accumulate)
        grad_weight.index_add_(0, token_ids.reshape(-1), rows)
        return None, grad_weight.to(ctx.weight_dtype)


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` (same parameter and state-dict name) whose backward is free of host syncs.

    Contract: ``forward(token_ids)`` returns ``weight[token_ids]`` of shape ``token_ids.shape + (d_model,)``;
    while gradients are recorded, ``weight``'s gradient is the sum of the output gradients of each id's rows
    ([Note: embedding backward without a host sync]). Without gradients it is ``nn.Embedding``'s lookup.
    """

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return _TokenLookup.apply(token_ids, self.weight)
        return super().forward(token_ids)
