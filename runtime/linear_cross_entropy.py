"""The LM head's projection and the summed cross-entropy in one pass over blocks of tokens.

[Note: fused head and loss]
``F.cross_entropy(F.linear(h, W).float(), targets, reduction="sum")`` holds the logits of every token at once:
``[T, V]`` in the model's dtype, a float32 copy and the float32 log-softmax that autograd keeps for the
backward. :func:`linear_cross_entropy` computes the same sum block by block, ``block_tokens`` rows at a time:
the block's logits ``h_b W^T`` in the model's dtype (one GEMM, accumulated as ``matmul`` accumulates), their
log-sum-exp in float32, the block's loss, and, because a summed scalar loss gets a scalar gradient ``g``, the
block's gradients at once: ``dlogits_b = softmax_b - onehot_b`` (zero on ignored rows) in float32, cast to the
model's dtype as the ``.float()`` backward would, then ``dh_b = dlogits_b W`` and ``dW += dlogits_b^T h_b``.
The loss and ``dlogits_b`` are :func:`schedlang.kernels.cross_entropy.cross_entropy_rows`: with ``backend =
"triton"`` one kernel that reads the block's logits twice and writes ``dlogits_b`` over them, where PyTorch's
path makes a float32 copy and five more passes over it.
The backward only scales: ``g dh`` and ``g dW``. Extra memory is O(``block_tokens`` x V) while the forward
runs; what is kept for the backward is ``dh`` (as large as ``h``) and ``dW`` (as large as ``W``), where the
plain path keeps the ``[T, V]`` float32 log-softmax: less for every chunk of more than ``D / 2`` tokens.

Precision. ``dW`` is summed over blocks in float32, each block's GEMM rounded once to the model's dtype as
torch's linear backward rounds its one GEMM (a single block skips the float32 sum), and the sum is rounded once
to the weight's dtype at the end of the forward, where it is kept; the backward's scaling by ``g`` rounds once
more. In float32 every step is float32. ``tests/runtime/test_linear_cross_entropy.py`` holds the loss, ``dh``
and ``dW`` to a float64 reference (relative error of the whole tensor): below 1e-5 in float32, below 1.5e-2
in bf16 and no more than twice the plain path's bf16 error.

Weight gradients. With ``accumulate_into_grad`` the backward adds ``g dW`` into ``weight.grad`` in place and
hands autograd no weight gradient, under the contract of [Note: in-place weight gradients] in
:mod:`schedlang.runtime.linear`. With ``add_into_existing_grad`` it does so whenever ``weight.grad`` exists
when the backward runs, and otherwise hands ``g dW`` to autograd, which adopts it as the ``.grad`` (the first
chunk's backward allocates, every later one adds in place): what autograd's own accumulation would leave,
without a separate addition kernel and without the custom autograd node a :class:`Linear` needs for it (the
loss has one already). Whoever asks autograd for the weight's gradient with ``torch.autograd.grad`` while
``weight.grad`` exists gets None. The weight gradient is formed in the forward, so there is no GEMM left for
a deferred ``W`` task ([Note: deferred weight gradients]): the head's weight gradient arrives with ``B``.

CUDA graphs: the number of blocks follows from the static shape, nothing reads a value back to the host,
and every tensor is allocated at a fixed point of the loop, so the forward and the backward can be captured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from schedlang.kernels.cross_entropy import cross_entropy_rows
from schedlang.runtime.packing import IGNORED_TARGET

LOSS_BLOCK_ELEMENTS = 1 << 27
"""The logits one block of the fused loss holds at most: ``block_tokens * vocab`` (512 MiB in float32)."""


def loss_block_tokens(vocab: int) -> int:
    """The default block of the fused loss: the largest power of two of at least 128 tokens whose
    ``block_tokens * vocab`` stays within :data:`LOSS_BLOCK_ELEMENTS` (4096 tokens for a vocabulary of 32000)."""
    tokens = 128
    while tokens * 2 * vocab <= LOSS_BLOCK_ELEMENTS:
        tokens *= 2
    return tokens


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        block_tokens: int,
        input_grad_needed: bool,
        weight_grad_needed: bool,
        accumulate_into_grad: bool,
        add_into_existing_grad: bool,
        backend: str,
    ) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])  # [T, D]
        target_rows = targets.reshape(-1)  # [T]
        n_rows = rows.shape[0]
        with_grad = input_grad_needed or weight_grad_needed
        single_block = n_rows <= block_tokens
        loss = torch.zeros((), dtype=torch.promote_types(weight.dtype, torch.float32), device=hidden.device)
        hidden_grad = torch.empty_like(rows) if input_grad_needed else None
        weight_grad = None
        if weight_grad_needed:
            summed_dtype = weight.dtype if single_block else torch.promote_types(weight.dtype, torch.float32)
            weight_grad = torch.zeros(weight.shape, dtype=summed_dtype, device=weight.device)  # [V, D]
        for start in range(0, n_rows, block_tokens):
            end = min(start + block_tokens, n_rows)
            block = rows[start:end]  # [B, D]
            block_loss, logits_grad = cross_entropy_rows(  # Triton's writes the gradient over the logits
                F.linear(block, weight), target_rows[start:end], ignore_index, with_grad, backend
            )
            loss += block_loss
            if logits_grad is None:
                continue
            if hidden_grad is not None:
                torch.mm(logits_grad, weight, out=hidden_grad[start:end])
            if weight_grad is not None:
                if weight_grad.dtype == weight.dtype:
                    weight_grad.addmm_(logits_grad.t(), block)
                else:
                    weight_grad += torch.mm(logits_grad.t(), block)
        if weight_grad is not None:
            weight_grad = weight_grad.to(weight.dtype)
        ctx.hidden_shape = hidden.shape
        ctx.has_hidden_grad = hidden_grad is not None
        ctx.has_weight_grad = weight_grad is not None
        ctx.accumulate_into_grad = accumulate_into_grad
        ctx.add_into_existing_grad = add_into_existing_grad
        # the parameter itself, for the in-place addition ([Note: in-place weight gradients])
        ctx.weight_parameter = weight if accumulate_into_grad or add_into_existing_grad else None
        ctx.save_for_backward(*(grad for grad in (hidden_grad, weight_grad) if grad is not None))
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, loss_grad: torch.Tensor):
        saved = list(ctx.saved_tensors)
        hidden_grad = saved.pop(0) if ctx.has_hidden_grad else None
        weight_grad = saved.pop(0) if ctx.has_weight_grad else None
        if hidden_grad is not None:
            hidden_grad = (hidden_grad * loss_grad).reshape(ctx.hidden_shape)
        parameter = ctx.weight_parameter
        if weight_grad is not None and parameter is not None and parameter.grad is not None:
            parameter.grad.addcmul_(weight_grad, loss_grad)
            weight_grad = None
        elif weight_grad is not None and ctx.accumulate_into_grad:
            raise RuntimeError(
                "the fused loss's head accumulates into .grad but its weight has no .grad to add into: "
                "allocate the gradients (zeros) before the first backward"
            )
        elif weight_grad is not None:
            weight_grad = weight_grad * loss_grad
        return hidden_grad, weight_grad, None, None, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = IGNORED_TARGET,
    block_tokens: int | None = None,
    accumulate_into_grad: bool = False,
    add_into_existing_grad: bool = False,
    backend: str = "torch",
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=..., reduction="sum")``
    without the whole logits: [Note: fused head and loss].

    Args:
        hidden: ``[..., D]`` (the final norm's output), in the weight's dtype.
        weight: ``[V, D]``, the LM head's (or the tied embedding's) weight.
        targets: ``hidden.shape[:-1]`` token ids in ``[0, V)``, or ``ignore_index`` for tokens without loss.
        block_tokens: rows per block; None: :func:`loss_block_tokens` of ``V``.
        accumulate_into_grad: the backward adds the weight gradient into ``weight.grad`` (which must exist)
            and gives autograd none ([Note: in-place weight gradients] in :mod:`schedlang.runtime.linear`).
        add_into_existing_grad: the backward adds the weight gradient into ``weight.grad`` if it exists then
            (a leaf's), and gives autograd none; else autograd gets it ([Note: fused head and loss]).
        backend: each block's loss and logits gradient (:func:`schedlang.kernels.cross_entropy.cross_entropy_rows`):
            "torch", "triton" (one kernel over the block's logits) or "auto".

    Returns the sum of the per-token losses (0-dim), in float32 (float64 for a float64 weight). Gradients are formed in the forward only when
    grad mode is on and ``hidden`` or ``weight`` requires them.
    """
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets of shape {tuple(targets.shape)} for hidden of shape {tuple(hidden.shape)}")
    if block_tokens is None:
        block_tokens = loss_block_tokens(weight.shape[0])
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    grad_enabled = torch.is_grad_enabled()
    input_grad_needed = grad_enabled and hidden.requires_grad
    weight_grad_needed = grad_enabled and weight.requires_grad
    return _LinearCrossEntropy.apply(
        hidden,
        weight,
        targets,
        ignore_index,
        block_tokens,
        input_grad_needed,
        weight_grad_needed,
        accumulate_into_grad and weight_grad_needed,
        add_into_existing_grad and weight_grad_needed and weight.is_leaf,
        backend,
    )
