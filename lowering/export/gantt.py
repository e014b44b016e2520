"""Timeline -> PNG Gantt chart, drawn with matplotlib's Agg canvas.

Input: a :class:`Timeline`. Output: PNG bytes (or a file) with one row per
stage (stage 0 on top), a bar per compute task, forwards in blues,
backwards in oranges and the weight-gradient tasks of a split backward in
greens (with a legend entry only when there are some), successive
microbatches in alternating shades so their boundaries show, each bar labelled with its task (``F0.1``, or ``0.1`` when
only that fits, or nothing), and a title giving the makespan and bubble
fraction. Only the compute stream is drawn; the Chrome trace shows the
communication streams.

The figure is built on a bare :class:`~matplotlib.figure.Figure` with an Agg
canvas, never through pyplot, so no global backend or figure state changes.
"""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from schedlang.lowering.timeline import Stream, Timeline
from schedlang.vocabulary.actions import ActionKind

_SHADES: dict[ActionKind, tuple[str, str]] = {
    ActionKind.FORWARD: ("#6fa8dc", "#3d85c6"),
    ActionKind.BACKWARD: ("#f6b26b", "#e69138"),
    ActionKind.WEIGHT: ("#93c47d", "#6aa84f"),
}
_LEGEND_LABELS: dict[ActionKind, str] = {
    ActionKind.FORWARD: "forward",
    ActionKind.BACKWARD: "backward",
    ActionKind.WEIGHT: "weight gradients",
}
GANTT_DOTS_PER_INCH = 100
_ROW_HEIGHT_INCHES = 0.55
_FONT_SIZE = 7
# Helvetica/DejaVu digits are about 0.6 em wide; enough to decide whether a label fits.
_CHARACTER_WIDTH_POINTS = 0.62 * _FONT_SIZE


def _bar_color(kind: ActionKind, microbatch: int) -> str:
    return _SHADES[kind][microbatch % 2]


def _label_for_width(full_label: str, short_label: str, width_points: float) -> str:
    for label in (full_label, short_label):
        if len(label) * _CHARACTER_WIDTH_POINTS + 2 <= width_points:
            return label
    return ""


def render_gantt(
    timeline: Timeline,
    *,
    title: str = "schedule",
    time_unit_name: str = "unit",
    width_inches: float = 12.0,
) -> Figure:
    """Draw the chart on a new figure (see the module docstring)."""
    n_stages = max(timeline.n_stages, 1)
    height_inches = 1.0 + _ROW_HEIGHT_INCHES * n_stages
    figure = Figure(figsize=(width_inches, height_inches), dpi=GANTT_DOTS_PER_INCH)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.08, 0.55 / height_inches, 0.9, 1 - 0.9 / height_inches))
    makespan = timeline.makespan if timeline.makespan > 0 else 1.0
    axes_width_points = 0.9 * width_inches * 72

    compute_intervals = sorted(
        (interval for interval in timeline.tasks if interval.stream is Stream.COMPUTE),
        key=lambda interval: (interval.task.stage, interval.start, str(interval.task)),
    )
    for interval in compute_intervals:
        task = interval.task
        row = task.stage
        axes.broken_barh(
            [(interval.start, interval.duration)],
            (row - 0.4, 0.8),
            facecolors=_bar_color(task.kind, task.microbatch),
            edgecolors="white",
            linewidth=0.6,
        )
        width_points = interval.duration / makespan * axes_width_points
        label = _label_for_width(task.local_form(), f"{task.microbatch}.{task.chunk}", width_points)
        if label:
            axes.text(
                interval.start + interval.duration / 2,
                row,
                label,
                ha="center",
                va="center",
                fontsize=_FONT_SIZE,
                color="black",
            )

    axes.set_xlim(0, makespan)
    axes.set_ylim(n_stages - 0.5, -0.5)
    axes.set_yticks(range(n_stages))
    axes.set_yticklabels([f"stage {stage}" for stage in range(n_stages)])
    axes.set_xlabel(f"time ({time_unit_name})")
    axes.grid(axis="x", color="#dddddd", linewidth=0.5)
    axes.set_axisbelow(True)
    axes.set_title(
        f"{title}: makespan {timeline.makespan:.4g} {time_unit_name}, "
        f"bubble fraction {timeline.bubble_fraction:.1%}",
        fontsize=10,
    )
    shown_kinds = [ActionKind.FORWARD, ActionKind.BACKWARD]
    if any(interval.task.kind is ActionKind.WEIGHT for interval in compute_intervals):
        shown_kinds.append(ActionKind.WEIGHT)
    figure.legend(
        handles=[Patch(facecolor=_SHADES[kind][0], label=_LEGEND_LABELS[kind]) for kind in shown_kinds],
        loc="upper right",
        ncols=len(shown_kinds),
        fontsize=7,
        frameon=False,
    )
    return figure


def gantt_png(timeline: Timeline, **options) -> bytes:
    """The chart as PNG bytes; ``options`` are those of :func:`render_gantt`."""
    buffer = io.BytesIO()
    # the Software tag is how schedlang.outputs recognises a chart it may replace
    render_gantt(timeline, **options).savefig(buffer, format="png", metadata={"Software": "schedlang"})
    return buffer.getvalue()


def write_gantt_png(timeline: Timeline, path: str | Path, **options) -> None:
    Path(path).write_bytes(gantt_png(timeline, **options))
