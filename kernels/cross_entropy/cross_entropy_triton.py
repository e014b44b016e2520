"""Triton cross-entropy rows: one program per row, two passes over its logits, the gradient written over them.

Pass one walks the row in tiles of ``BLOCK`` columns keeping a running maximum ``m`` and the sum ``s`` of
``exp(x - m)`` (rescaled by ``exp(m_old - m_new)`` when the maximum grows), so ``lse = m + log s`` without a
float32 copy of the row. The row's loss is ``lse - x[target]`` (0 on an ignored row). Pass two, with
``WRITE_GRAD``, reads the row again and stores ``exp(x - lse)``, minus 1 at the target, times the row's
validity, rounded to the logits' dtype, over the logits themselves. Elementwise and reductions only: no ``tl.dot``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from schedlang.kernels.common.sizes import block_size

BLOCK_LIMIT = 4096
NUM_WARPS = 8


@triton.jit
def cross_entropy_rows_kernel(
    logits, targets, losses, row_stride, ignore_index, V: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits + row * row_stride
    running_max = tl.full([], float("-inf"), tl.float32)
    running_sum = tl.zeros([], tl.float32)
    for tile in range(tl.cdiv(V, BLOCK)):
        columns = tile * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(base + columns, mask=columns < V, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, 0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
        running_max = new_max
    lse = running_max + tl.log(running_sum)
    target = tl.load(targets + row)
    valid = target != ignore_index
    safe_target = tl.where(valid, target, 0)
    target_logit = tl.load(base + safe_target).to(tl.float32)
    tl.store(losses + row, tl.where(valid, lse - target_logit, 0.0))
    if WRITE_GRAD:
        for tile in range(tl.cdiv(V, BLOCK)):
            columns = tile * BLOCK + tl.arange(0, BLOCK)
            mask = columns < V
            x = tl.load(base + columns, mask=mask, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) - tl.where(columns == safe_target, 1.0, 0.0)
            grad = tl.where(valid, grad, 0.0)
            tl.store(base + columns, grad.to(logits.dtype.element_ty), mask=mask)


def cross_entropy_rows_triton(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """See :func:`schedlang.kernels.cross_entropy.cross_entropy_rows`; the gradient is ``logits`` itself."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n_rows, vocab = logits.shape
    losses = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    cross_entropy_rows_kernel[(n_rows,)](
        logits, targets.contiguous(), losses, logits.stride(0), ignore_index, V=vocab,
        WRITE_GRAD=with_grad, BLOCK=block_size(vocab, BLOCK_LIMIT), num_warps=NUM_WARPS,
    )
    return losses.sum(), logits if with_grad else None
