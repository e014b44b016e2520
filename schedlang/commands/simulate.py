"""``schedlang simulate FILE``: time and activation memory of the schedule under a cost model.

Prints a per-stage table, or with ``--json`` an object with ``makespan``,
``bubble_fraction``, ``peak_activations`` (one number per stage), ``busy_time``
per stage, the task count, the time unit and, for reference, StateFlow's
closed-form estimates (Eq. 13 and Eq. 15). An illegal schedule prints its
violations, as ``schedlang check`` does, and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "simulate the schedule: makespan, bubble fraction and peak activations per stage"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument(
        "--cost-model",
        choices=("unit", "flops"),
        default="unit",
        help="unit: forward of s tokens costs s/T, backward 2s/T, free messages; "
        "flops: layer FLOPs over device throughput plus alpha-beta messages (docs/cost-model.md)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    parser.add_argument("--throughput", type=float, default=400e12, help="flops model: device FLOP/s")
    parser.add_argument("--latency", type=float, default=10e-6, help="flops model: message latency alpha, s")
    parser.add_argument("--bandwidth", type=float, default=50e9, help="flops model: link bandwidth beta, B/s")


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise SystemExit(f"schedlang simulate: error: --{name} must be positive, got {value}")


def run(args: argparse.Namespace) -> int:
    from schedlang.frontend import load_program, read_source
    from schedlang.lowering.cost import CostModelKind, Hardware, make_cost_model
    from schedlang.lowering.legality import check_orders, render_report
    from schedlang.lowering.memory import stateflow_makespan, stateflow_peak_activations
    from schedlang.lowering.simulate import simulate
    from schedlang.lowering.timeline import Stream

    for name in ("throughput", "bandwidth"):
        _positive(name, getattr(args, name))
    if args.latency < 0:
        raise SystemExit(f"schedlang simulate: error: --latency must not be negative, got {args.latency}")
    program = load_program(args.file)
    report = check_orders(program)
    if not report.is_legal:
        text = read_source(args.file)
        print(render_report(report, {str(args.file): text, program.source_file: text}), file=sys.stderr)
        return 1
    kind = CostModelKind(args.cost_model)
    hardware = Hardware(args.throughput, args.latency, args.bandwidth)
    timeline = simulate(program, cost_model=make_cost_model(kind, program, hardware))
    busy = [0.0] * program.n_stages
    for interval in timeline.tasks:
        if interval.stream is Stream.COMPUTE:
            busy[interval.task.stage] += interval.duration
    result = {
        "file": str(args.file),
        "cost_model": kind.value,
        "time_unit": "full-sequence forward" if kind is CostModelKind.UNIT else "second",
        "order": program.pipeline.order.value,
        "n_stages": program.n_stages,
        "n_microbatches": program.n_microbatches,
        "n_chunks": program.n_chunks,
        "n_tasks": report.n_tasks,
        "makespan": timeline.makespan,
        "bubble_fraction": timeline.bubble_fraction,
        "busy_time": busy,
        "peak_activations": list(timeline.peak_activations),
        "eq13_peak_activations": list(
            stateflow_peak_activations(program.n_stages, program.n_microbatches, program.n_chunks)
        ),
        "eq15_makespan_unit": stateflow_makespan(program.n_stages, program.n_microbatches, program.n_chunks),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.file}: {program.n_stages} stages x {program.n_microbatches} microbatches x "
        f"{program.n_chunks} chunks, order {result['order']}, cost model {kind.value} "
        f"(time in {result['time_unit']}s)"
    )
    print(f"makespan {timeline.makespan:.6g}   bubble fraction {timeline.bubble_fraction:.4f}")
    print(f"{'stage':>5}  {'busy':>12}  {'peak activations':>16}")
    for stage in range(program.n_stages):
        print(f"{stage:>5}  {busy[stage]:>12.6g}  {timeline.peak_activations[stage]:>16.4g}")
    return 0
