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

from schedlang.commands.common import (
    add_cost_model_arguments,
    check_hardware_arguments,
    cost_model_from_arguments,
    load_legal_program,
)

HELP = "simulate the schedule: makespan, bubble fraction and peak activations per stage"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    add_cost_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from schedlang.lowering.cost import CostModelKind
    from schedlang.lowering.memory import stateflow_makespan, stateflow_peak_activations
    from schedlang.lowering.simulate import simulate
    from schedlang.lowering.timeline import Stream

    check_hardware_arguments(args, "simulate")
    loaded = load_legal_program(args.file)
    if loaded is None:
        return 1
    program, orders = loaded
    kind, cost_model = cost_model_from_arguments(args, program)
    timeline = simulate(program, orders, cost_model)
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
        "n_tasks": sum(len(order) for order in orders),
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
