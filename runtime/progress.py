"""Per-step reporting on rank 0: a progress line, the JSON-lines metrics file and TensorBoard scalars.

With a TensorBoard directory (``train.log = tensorboard(directory = ...)``) every step's metrics are also
written as scalars ``train/loss``, ``train/tokens_per_second``, ``train/step_seconds``,
``train/peak_memory_gib`` and ``train/learning_rate`` (and ``train/loss_scale`` with fp16's loss scaling) at the
step number, through
torch's ``SummaryWriter``, which needs the ``tensorboard`` package (the ``tensorboard`` extra); ``check`` and
``run`` say so before launch.

The metrics file is strict JSON lines: a value that is not finite (a loss of ``nan``) is written as ``null``.
It is appended to only when it is a regular file, never through a symbolic link ([Note: file safety] in
schedlang.vocabulary.files).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import TextIO

from schedlang.vocabulary.files import finite_or_none, open_for_append

BAR_WIDTH = 24


@dataclass(frozen=True)
class StepMetrics:
    step: int
    loss: float
    tokens_per_second: float
    step_seconds: float
    peak_memory_bytes: int
    validation_loss: float | None = None  # after this step, when it evaluated (train.eval_every)
    loss_scale: float | None = None  # the step's fp16 loss scale; None without loss scaling
    skipped: bool | None = None  # whether inf or nan gradients skipped the step; None without loss scaling
    learning_rate: float | None = None  # the rate the step's optimizer update used; None when not known
    # with pipeline.offload on CUDA: the most pinned host memory the allocator has held so far, its blocks rounded
    # up as it rounds them (torch.cuda.host_memory_stats); None otherwise
    pinned_host_bytes: int | None = None
    # on CUDA: the caching allocator's retries so far (runtime.trainer.allocator_retries); None otherwise
    allocator_retries: int | None = None


def format_bytes(n_bytes: int) -> str:
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def progress_line(metrics: StepMetrics, total_steps: int) -> str:
    done = min(BAR_WIDTH, round(BAR_WIDTH * metrics.step / max(total_steps, 1)))
    bar = "#" * done + "." * (BAR_WIDTH - done)
    validation = "" if metrics.validation_loss is None else f"  val {metrics.validation_loss:.4f}"
    rate = "" if metrics.learning_rate is None else f"  lr {metrics.learning_rate:.3g}"
    scale = "" if metrics.loss_scale is None else f"  scale {metrics.loss_scale:g}"
    if metrics.skipped:
        scale += " (skipped: inf/nan gradients)"
    pinned = "" if metrics.pinned_host_bytes is None else f"  pinned {format_bytes(metrics.pinned_host_bytes)}"
    return (
        f"[{bar}] step {metrics.step}/{total_steps}  loss {metrics.loss:.4f}{validation}{rate}  "
        f"{metrics.tokens_per_second:,.0f} tok/s  peak mem {format_bytes(metrics.peak_memory_bytes)}{pinned}{scale}"
    )


class StepReporter:
    """Appends one JSON object per step to ``metrics_path``, whatever ``log_every`` is, and prints the progress
    lines the trainer asks to show."""

    def __init__(
        self,
        total_steps: int,
        metrics_path: str | None,
        stream: TextIO = sys.stdout,
        tensorboard_directory: str | None = None,
    ) -> None:
        self.total_steps = total_steps
        self.stream = stream
        self.metrics_file = open_for_append(metrics_path) if metrics_path else None
        self.tensorboard = None
        if tensorboard_directory is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(tensorboard_directory)

    def report(self, metrics: StepMetrics, show: bool = True) -> None:
        """Append the step to the metrics file; print its progress line too when ``show`` (``log_every``)."""
        if show:
            print(progress_line(metrics, self.total_steps), file=self.stream, flush=True)
        if self.metrics_file is not None:
            record = {key: value for key, value in asdict(metrics).items() if value is not None}
            self.metrics_file.write(json.dumps(finite_or_none(record), allow_nan=False) + "\n")
            self.metrics_file.flush()
        if self.tensorboard is not None:
            self.tensorboard.add_scalar("train/loss", metrics.loss, metrics.step)
            self.tensorboard.add_scalar("train/tokens_per_second", metrics.tokens_per_second, metrics.step)
            self.tensorboard.add_scalar("train/step_seconds", metrics.step_seconds, metrics.step)
            self.tensorboard.add_scalar("train/peak_memory_gib", metrics.peak_memory_bytes / 2**30, metrics.step)
            if metrics.learning_rate is not None:
                self.tensorboard.add_scalar("train/learning_rate", metrics.learning_rate, metrics.step)
            if metrics.validation_loss is not None:
                self.tensorboard.add_scalar("validation/loss", metrics.validation_loss, metrics.step)
            if metrics.loss_scale is not None:
                self.tensorboard.add_scalar("train/loss_scale", metrics.loss_scale, metrics.step)

    def close(self) -> None:
        if self.metrics_file is not None:
            self.metrics_file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
