"""The summed cross-entropy of rows of logits and its gradient w.r.t. them: the public call and the PyTorch path.

Contract. For ``logits`` ``[N, V]`` and ``targets`` ``[N]`` (token ids in ``[0, V)``, or ``ignore_index``):
    loss = sum over rows n with targets[n] != ignore_index of  logsumexp(logits[n]) - logits[n, targets[n]]
    grad = softmax(logits[n]) - onehot(targets[n])  on those rows, zero on ignored rows
both computed in float32 (float64 for float64 logits), ``loss`` returned in that dtype (0-dim) and ``grad``
rounded once to the logits' dtype: exactly what ``F.cross_entropy(logits.float(), targets, reduction="sum")``
and its backward through ``.float()`` give for a loss gradient of 1. ``grad`` may share the logits' storage
(the Triton path writes it over them: the logits are read twice, the gradient written once, where the PyTorch
path makes a float32 copy and five more passes over it); callers pass logits they do not need again.
"""

from __future__ import annotations

import torch

from schedlang.kernels.common import Backend, resolve_backend


def _torch_cross_entropy_rows(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    compute = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [N, V]; itself if float32 already
    valid = targets != ignore_index  # [N]
    safe_targets = torch.where(valid, targets, torch.zeros_like(targets)).unsqueeze(1)  # [N, 1]
    target_logits = compute.gather(1, safe_targets).squeeze(1)  # [N]
    log_normalisers = torch.logsumexp(compute, dim=1)  # [N]
    loss = ((log_normalisers - target_logits) * valid).sum()
    if not with_grad:
        return loss, None
    probabilities = compute.sub_(log_normalisers.unsqueeze(1)).exp_()
    probabilities.scatter_add_(1, safe_targets, torch.full_like(target_logits, -1.0).unsqueeze(1))
    probabilities.mul_(valid.unsqueeze(1))
    return loss, probabilities.to(logits.dtype)


def cross_entropy_rows(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    with_grad: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The summed cross-entropy of ``logits`` rows and, with ``with_grad``, its gradient (module doc).

    Args:
        logits: ``[N, V]`` floating point; may be overwritten.
        targets: ``[N]`` integer token ids, ``ignore_index`` where a row has no loss.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1 for float32, else PyTorch), "triton" or
            "torch". Float64 logits always take the PyTorch path.
    Returns ``(loss, grad)``: ``loss`` 0-dim in float32 (float64 for float64 logits), ``grad`` ``[N, V]`` in
    the logits' dtype or None.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be [N, V] and targets [N], got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    chosen = resolve_backend(backend, logits.device, matmul_dtype=logits.dtype)
    if chosen is Backend.TORCH or logits.dtype == torch.float64 or logits.shape[0] == 0:
        return _torch_cross_entropy_rows(logits, targets, ignore_index, with_grad)
    from schedlang.kernels.cross_entropy.cross_entropy_triton import cross_entropy_rows_triton

    return cross_entropy_rows_triton(logits, targets, ignore_index, with_grad)


def naive_cross_entropy_rows(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: torch's own ``F.cross_entropy`` in float64 and its gradient by autograd (float64)."""
    leaf = logits.detach().to(torch.float64).requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(leaf, targets, ignore_index=ignore_index, reduction="sum")
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad
