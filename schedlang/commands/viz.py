"""``schedlang viz FILE --format dot|chrome|png -o OUT``: draw the schedule.

* ``dot``: the Eq. 8 task graph as Graphviz DOT, one cluster per stage, laid
  out in each stage's program order (render with ``dot -Tsvg``);
* ``chrome``: the simulated timeline as Chrome trace JSON (open in
  https://ui.perfetto.dev): one process per stage, one track per stream, flow
  arrows for activations, gradients and state hand-offs;
* ``png``: the simulated timeline as a Gantt chart.

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument("--format", required=True, choices=[member.value for member in VizFormat])
    parser.add_argument("-o", "--output", required=True, help="output file; '-' for standard output (dot, chrome)")
    add_cost_model_arguments(parser)
    parser.add_argument(
        "--program-order",
        choices=("invisible", "dotted", "none"),
        default="invisible",
        help="dot: chain each stage's tasks in program order, invisibly (layout only) or as dotted edges",
    )


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
    from schedlang.lowering.export.gantt import gantt_png
    from schedlang.lowering.graph import chunk_tokens, task_graph

    output_format = VizFormat(args.format)
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
        write_output(args.output, gantt_png(timeline, title=program.name, time_unit_name=time_unit_name))
    return 0
