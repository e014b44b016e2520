"""Loss scaling for fp16 training, agreed by every rank of the job.

[Note: loss scaling]
fp16 has five exponent bits: a gradient below 2**-24 flushes to zero and one above 65504 overflows. With
``train.loss_scale`` (``dynamic`` by default with ``dtype = fp16``, a fixed number, or ``none``) a step runs:

* the last stage's backward starts from the scale instead of 1 (``StageExecutor.loss_gradient``), so every
  gradient of the step, the activation and state gradients sent between stages and sequence ranks included,
  is the true one times the scale; the reported loss is not scaled;
* after the data-parallel, sequence-parallel and tied-embedding all-reduces, :meth:`LossScaler.unscale`
  multiplies the gradients the optimizer reads (the fp32 master gradients with master weights) by the
  reciprocal of the scale and checks them for inf and nan in one pass, with the op
  ``torch.amp.GradScaler.unscale_`` uses (``torch._amp_foreach_non_finite_check_and_unscale_``); the flag is
  all-reduced (max) over the whole world, so a stage or replica that overflows skips the step everywhere;
* a skipped step leaves the parameters and the optimizer's state untouched (no clip, no optimizer step), as
  ``GradScaler.step`` does; the learning-rate schedule advances all the same, as in a GradScaler loop that
  calls ``scheduler.step()`` every iteration: the learning rate stays a function of the step number, so a
  resume needs no count of skipped steps (Megatron-LM holds its schedule back instead);
* :meth:`LossScaler.update` then changes a dynamic scale with ``GradScaler.update``'s op
  (``torch._amp_update_scale_``) and rules: times ``backoff_factor`` (0.5) after a step with inf or nan, times
  ``growth_factor`` (2) after ``growth_interval`` (2000) steps in a row without, from ``initial`` (2**16). A
  fixed scale skips overflowing steps the same way and never changes.

The scale and the count of steps since the last overflow are saved in every checkpoint and loaded on resume
(schedlang.runtime.checkpoint), so a resumed run scales as the uninterrupted one. Deciding whether to step
reads the flag on the host: with loss scaling the step boundary waits for every rank, as ``grad_clip``'s
norm already makes it.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from schedlang.vocabulary import LossScaleConfig


class LossScaler:
    """The scale of one run's losses on one rank; every rank holds the same values ([Note: loss scaling])."""

    def __init__(self, config: LossScaleConfig, device: torch.device) -> None:
        self.config = config
        self.scale = torch.full((), config.initial, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self.skipped = False  # whether the last unscaled step found inf or nan
        self.scale_used = float(config.initial)  # the scale of the last unscaled step, on the host

    def unscale(self, gradients: list[torch.Tensor], group: dist.ProcessGroup | None = None) -> bool:
        """Divide ``gradients`` by the scale in place and agree over ``group`` (the world when None) whether
        any rank's holds inf or nan; returns that (the step must be skipped)."""
        self.scale_used = float(self.scale)
        self.found_inf.zero_()
        inverse = self.scale.double().reciprocal().float()
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for gradient in gradients:
            by_kind[(gradient.device, gradient.dtype)].append(gradient)
        for same_kind in by_kind.values():
            torch._amp_foreach_non_finite_check_and_unscale_(same_kind, self.found_inf, inverse)
        if dist.is_initialized():
            dist.all_reduce(self.found_inf, op=dist.ReduceOp.MAX, group=group)
        self.skipped = bool(self.found_inf.item())
        return self.skipped

    def update(self) -> None:
        """After the step: a dynamic scale backs off after inf or nan and grows after ``growth_interval``
        clean steps in a row (``torch.amp.GradScaler.update``'s rules); a fixed one stays."""
        if not self.config.dynamic:
            return
        config = self.config
        torch._amp_update_scale_(
            self.scale,
            self.growth_tracker,
            self.found_inf,
            config.growth_factor,
            config.backoff_factor,
            config.growth_interval,
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint saves and a resume loads in place."""
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}
