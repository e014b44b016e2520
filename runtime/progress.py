"""Per-step reporting on rank 0: a progress line and the JSON-lines metrics file."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import TextIO

BAR_WIDTH = 24


@dataclass(frozen=True)
class StepMetrics:
    step: int
    loss: float
    tokens_per_second: float
    step_seconds: float
    peak_memory_bytes: int


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
    return (
        f"[{bar}] step {metrics.step}/{total_steps}  loss {metrics.loss:.4f}  "
        f"{metrics.tokens_per_second:,.0f} tok/s  peak mem {format_bytes(metrics.peak_memory_bytes)}"
    )


class StepReporter:
    """Appends one JSON object per step to ``metrics_path``, whatever ``log_every`` is, and prints the progress
    lines the trainer asks to show."""

    def __init__(self, total_steps: int, metrics_path: str | None, stream: TextIO = sys.stdout) -> None:
        self.total_steps = total_steps
        self.stream = stream
        self.metrics_file = open(metrics_path, "a", encoding="utf-8") if metrics_path else None

    def report(self, metrics: StepMetrics, show: bool = True) -> None:
        """Append the step to the metrics file; print its progress line too when ``show`` (``log_every``)."""
        if show:
            print(progress_line(metrics, self.total_steps), file=self.stream, flush=True)
        if self.metrics_file is not None:
            self.metrics_file.write(json.dumps(asdict(metrics)) + "\n")
            self.metrics_file.flush()

    def close(self) -> None:
        if self.metrics_file is not None:
            self.metrics_file.close()
