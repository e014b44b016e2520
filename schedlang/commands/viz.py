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
import sys
from enum import Enum
from pathlib import Path

HELP = "draw the task graph (DOT) or the simulated timeline (Chrome trace JSON, PNG Gantt chart)"


class VizFormat(str, Enum):
    DOT = "dot"
    CHROME = "chrome"
    PNG = "png"


def add_cost_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The cost model options, as ``schedlang simulate`` spells them."""
    parser.add_argument(
        "--cost-model",
        choices=("unit", "flops"),
        default="unit",
        help="unit: forward of s tokens costs s/T, backward 2s/T, free messages; "
        "flops: layer FLOPs over device throughput plus alpha-beta messages (docs/cost-model.md)",
    )
    parser.add_argument("--throughput", type=float, default=400e12, help="flops model: device FLOP/s")
    parser.add_argument("--latency", type=float, default=10e-6, help="flops model: message latency alpha, s")
    parser.add_argument("--bandwidth", type=float, default=50e9, help="flops model: link bandwidth beta, B/s")


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


def load_legal_program(path: str):
    """The checked program and its orders, or None after printing why the schedule is illegal."""
    from schedlang.frontend import load_program, read_source
    from schedlang.lowering.legality import check_orders, render_report
    from schedlang.lowering.orders import stage_orders

    program = load_program(path)
    report = check_orders(program)
    if not report.is_legal:
        text = read_source(path)
        print(render_report(report, {str(path): text, program.source_file: text}), file=sys.stderr)
        return None
    return program, stage_orders(program)


def write_output(output: str, content: str | bytes) -> None:
    if output == "-":
        if isinstance(content, bytes):
            raise SystemExit("schedlang: error: a PNG cannot be written to standard output; give -o FILE.png")
        sys.stdout.write(content)
        return
    if isinstance(content, bytes):
        Path(output).write_bytes(content)
    else:
        Path(output).write_text(content, encoding="utf-8")


def _check_hardware(args: argparse.Namespace) -> None:
    for name in ("throughput", "bandwidth"):
        if not getattr(args, name) > 0:
            raise SystemExit(f"schedlang viz: error: --{name} must be positive, got {getattr(args, name)}")
    if args.latency < 0:
        raise SystemExit(f"schedlang viz: error: --latency must not be negative, got {args.latency}")


def run(args: argparse.Namespace) -> int:
    from schedlang.lowering.cost import CostModelKind, Hardware, make_cost_model
    from schedlang.lowering.export.chrome import (
        MICROSECONDS_PER_SECOND,
        MICROSECONDS_PER_UNIT_COST,
        chrome_trace_json,
        timeline_to_chrome_trace,
    )
    from schedlang.lowering.export.dot import ProgramOrderEdges, task_graph_to_dot
    from schedlang.lowering.export.gantt import gantt_png
    from schedlang.lowering.graph import chunk_tokens, task_graph
    from schedlang.lowering.simulate import simulate

    output_format = VizFormat(args.format)
    _check_hardware(args)
    loaded = load_legal_program(args.file)
    if loaded is None:
        return 1
    program, orders = loaded

    if output_format is VizFormat.DOT:
        text = task_graph_to_dot(
            task_graph(program),
            orders=orders,
            program_order_edges=ProgramOrderEdges(args.program_order),
            name=program.name,
        )
        write_output(args.output, text)
        return 0

    kind = CostModelKind(args.cost_model)
    hardware = Hardware(args.throughput, args.latency, args.bandwidth)
    timeline = simulate(program, orders, make_cost_model(kind, program, hardware))
    time_unit_name = "unit" if kind is CostModelKind.UNIT else "s"
    if output_format is VizFormat.CHROME:
        scale = MICROSECONDS_PER_UNIT_COST if kind is CostModelKind.UNIT else MICROSECONDS_PER_SECOND
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
