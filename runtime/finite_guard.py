"""A run stops at the first step whose loss is not finite, and never saves weights that are not.

[Note: non-finite loss] A loss of ``nan`` or ``inf`` (a learning rate of 1e308, data the model cannot fit)
makes every later step meaningless, and a checkpoint of such weights poisons every resume. The trainer asks
:func:`stop_unless_finite` about each step's loss as it reads it (the loss is summed over all ranks, so every
rank decides alike) and, before each save, :func:`stop_unless_finite_weights` (an all-reduce of one flag), so
the newest checkpoint always holds finite weights. Either ends the process with :class:`NonFiniteLossError`:
one line on rank 0, exit status 1 on every rank. A step fp16's loss scaling skipped is not a failure
([Note: loss scaling] in schedlang.runtime.loss_scale): its update was not applied.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class NonFiniteLossError(SystemExit):
    """The run stopped at a non-finite loss or weights; the code is the one line rank 0 prints, or 1."""


def _stopped(rank_zero: bool, what: str, last_saved: int | None) -> NonFiniteLossError:
    saved = (
        "no checkpoint was written" if not last_saved else f"the newest checkpoint (step {last_saved}) is before it"
    )
    message = (
        f"schedlang: error: {what}: training stopped, {saved}; lower the learning rate "
        "(train.optimizer = adamw(lr = ...)) or check the data"
    )
    return NonFiniteLossError(message if rank_zero else 1)


def stop_unless_finite(step: int, loss: float, skipped: bool, rank_zero: bool, last_saved: int | None) -> None:
    """Raise :class:`NonFiniteLossError` when step ``step``'s loss is not finite and loss scaling did not skip it."""
    if not math.isfinite(loss) and not skipped:
        raise _stopped(rank_zero, f"the loss of step {step} is {loss}, not a finite number", last_saved)


def stop_unless_finite_weights(
    step: int, parameters, device: torch.device, rank_zero: bool, last_saved: int | None
) -> None:
    """Raise :class:`NonFiniteLossError` on every rank when any rank's parameters hold a nan or inf after step
    ``step`` (called before a checkpoint is saved)."""
    bad = torch.zeros((), device=device)
    for parameter in parameters:
        bad = torch.maximum(bad, (~torch.isfinite(parameter.detach())).any().to(bad.dtype))
    if dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item():
        raise _stopped(rank_zero, f"the weights after step {step} are not finite", last_saved)
