"""``schedlang viz FILE [--format dot|chrome|png] -o OUT [--width PIXELS]``: draw the schedule.

* ``dot``: the Eq. 8 task graph as Graphviz DOT, one cluster per stage, laid
  out in each stage's program order (render with ``dot -Tsvg``);
* ``chrome``: the simulated timeline as Chrome trace JSON (open in
  https://ui.perfetto.dev): one process per stage, one track per stream, flow
  arrows for activations, gradients and state hand-offs;
* ``png``: the simulated timeline as a Gantt chart, ``--width`` pixels wide (1200 by default).

Without ``--format`` the format follows ``-o``'s suffix (``.dot``/``.gv``, ``.json``, ``.png``).

``-o -`` writes the text formats to standard output. An illegal schedule is
not drawn: its violations are printed as ``schedlang check`` prints them and
the exit status is 1. See docs/visualization.md.
"""

from __future__ import annotations

import argparse
from enum import Enum

from schedlang.commands.common import (
    add_cost_model_arguments,
    check_hardware_arguments,
    compile_legal,
    cost_settings_from_arguments,
    write_output,
)

HELP = "draw the task graph (DOT) or the simulated timeline (Chrome trace JSON, PNG Gantt chart)"


class VizFormat(str, Enum):
    DOT = "dot"
    CHROME = "chrome"
    PNG = "png"


FORMAT_OF_SUFFIX = {".dot": VizFormat.DOT, ".gv": VizFormat.DOT, ".json": VizFormat.CHROME, ".png": VizFormat.PNG}
"""The format ``-o``'s suffix implies when ``--format`` is not given."""

DEFAULT_PNG_WIDTH = 1200
MIN_PNG_WIDTH = 300
MAX_PNG_WIDTH = 32768
"""PNG widths in pixels: the default, and the bounds ``--width`` accepts (below 300 the axis labels overlap;
matplotlib's Agg canvas refuses images wider than 2^16 pixels)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument(
        "--format", default=None, choices=[member.value for member in VizFormat],
        help="default: from -o's suffix (.dot or .gv, .json, .png)",
    )
    parser.add_argument("-o", "--output", required=True, help="output file; '-' for standard output (dot, chrome)")
    parser.add_argument(
        "--width", type=int, default=None,
        help=f"png: the chart's width in pixels ({MIN_PNG_WIDTH}-{MAX_PNG_WIDTH}, default {DEFAULT_PNG_WIDTH}); "
        "wider charts label more bars",
    )
    add_cost_model_arguments(parser)
    parser.add_argument(
        "--program-order",
        choices=("invisible", "dotted", "none"),
        default="invisible",
        help="dot: chain each stage's tasks in program order, invisibly (layout only) or as dotted edges",
    )


def output_format_of(args: argparse.Namespace) -> VizFormat:
    """``--format``, or the format ``-o``'s suffix implies; ``SystemExit`` with the reason when neither says."""
    from pathlib import Path

    if args.format is not None:
        return VizFormat(args.format)
    if args.output == "-":
        raise SystemExit("schedlang viz: error: give --format (dot or chrome) to write to standard output")
    suffix = Path(args.output).suffix.lower()
    if suffix not in FORMAT_OF_SUFFIX:
        known = ", ".join(FORMAT_OF_SUFFIX)
        raise SystemExit(
            f"schedlang viz: error: cannot tell the format from {args.output!r}; "
            f"give --format dot|chrome|png or an output ending in {known}"
        )
    return FORMAT_OF_SUFFIX[suffix]


def png_width(args: argparse.Namespace, output_format: VizFormat) -> int:
    """``--width`` checked against its bounds and the format; the default for a PNG without it."""
    if args.width is None:
        return DEFAULT_PNG_WIDTH
    if output_format is not VizFormat.PNG:
        raise SystemExit(f"schedlang viz: error: --width sizes the png chart; {output_format.value} has no width")
    if not MIN_PNG_WIDTH <= args.width <= MAX_PNG_WIDTH:
        raise SystemExit(
            f"schedlang viz: error: --width must be {MIN_PNG_WIDTH} to {MAX_PNG_WIDTH} pixels, got {args.width}"
        )
    return args.width


def run(args: argparse.Namespace) -> int:
    from schedlang.compiler import Pass
    from schedlang.frontend import load_program
    from schedlang.limits import check_drawable
    from schedlang.lowering.cost import CostModelKind
    from schedlang.lowering.export.chrome import (
        MICROSECONDS_PER_SECOND,
        MICROSECONDS_PER_UNIT_COST,
        chrome_trace_json,
        timeline_to_chrome_trace,
    )
    from schedlang.lowering.export.dot import ProgramOrderEdges, task_graph_to_dot
    from schedlang.lowering.export.gantt import GANTT_DOTS_PER_INCH, gantt_png
    from schedlang.lowering.graph import chunk_tokens, task_graph

    output_format = output_format_of(args)
    width = png_width(args, output_format)
    check_hardware_arguments(args, "viz")
    program = load_program(args.file)
    check_drawable(program, output_format.value)

    if output_format is VizFormat.DOT:
        compilation = compile_legal(program, Pass.LEGALITY)
        if compilation is None:
            return 1
        text = task_graph_to_dot(
            task_graph(program),
            orders=compilation.orders,
            program_order_edges=ProgramOrderEdges(args.program_order),
            name=program.name,
        )
        write_output(args.output, text)
        return 0

    cost = cost_settings_from_arguments(args)
    compilation = compile_legal(program, Pass.COST, cost)
    if compilation is None:
        return 1
    timeline = compilation.timeline
    time_unit_name = "unit" if cost.kind is CostModelKind.UNIT else "s"
    if output_format is VizFormat.CHROME:
        scale = MICROSECONDS_PER_UNIT_COST if cost.kind is CostModelKind.UNIT else MICROSECONDS_PER_SECOND
        trace = timeline_to_chrome_trace(
            timeline,
            chunk_lengths=chunk_tokens(program),
            microseconds_per_time_unit=scale,
            time_unit_name=time_unit_name,
            name=program.name,
        )
        write_output(args.output, chrome_trace_json(trace))
    else:
        width_inches = width / GANTT_DOTS_PER_INCH
        chart = gantt_png(timeline, title=program.name, time_unit_name=time_unit_name, width_inches=width_inches)
        write_output(args.output, chart)
    return 0
