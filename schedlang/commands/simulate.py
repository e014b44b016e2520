"""``schedlang simulate FILE``: time and memory of the schedule under a cost model.

Prints a per-stage table and a per-stage memory table (each component of the predicted peak in GiB:
:mod:`schedlang.lowering.memory_peak`), or with ``--json`` an object with ``makespan``,
``bubble_fraction``, ``peak_activations`` (one number per stage), ``busy_time``
and ``gradient_reduction`` (the step's gradient all-reduce after the stage's last task) per stage, the task
count, ``split_backward``, the time unit, ``memory`` (one object per stage: each
component, ``allocated`` and ``reserved`` in GiB, the chunks in flight and the task running at the peak)
and, for reference, StateFlow's closed-form estimates (Eq. 13 and Eq. 15). An illegal
schedule prints its violations, as ``schedlang check`` does, and exits 1.

With packed documents (``document_end`` in ``train.data``) the data is checked as ``schedlang check`` checks it
and the figures include the recurrent operators' padding ([Note: packed documents] in
schedlang.runtime.packing) for the most document pieces a chunk of the data can hold
(schedlang.preflight.with_document_pieces); the table says so, and ``--json`` gives ``document_pieces``: per
chunk length its pieces and the operators' padded tokens per sequence (null without packing).

With ``pipeline.offload`` it also prints each stage's pinned host memory (every chunk in flight keeps its saved
activations there) and each node's sum against ``--host-memory``'s pinned share (one node's host memory; the
hardware profile's ``[host]`` by default, docs/cost-model.md, "Host memory"); a node over it is an error that
names the node, the stage and the term, and the exit status is 1 (``--json``: ``pinned_host`` per stage, and
``host_memory`` with each node's bytes and the misfits). Device memory is judged only by ``--fit``.

``--fit`` asks the memory model the longest sequence this model and mesh can train on a device of
``--device-memory`` (and, offloading, a host of ``--host-memory``) and the chunk count to cut it into
(:mod:`schedlang.commands.simulate_fit`).

``--split-backward`` simulates the schedule as if it set ``pipeline {
split_backward = true }``: every backward's weight gradients become a ``W``
task of their own, placed as the generated orders place them ([Note: split
backward] in lowering/orders.py) and costed as [Note: split backward costs] in
lowering/cost.py says. An explicit order names its own tasks, so it is
refused there: write the ``W`` tasks and ``split_backward = true`` in the file.

With ``--chunks N [N ...]`` it simulates the same schedule with its sequence
re-cut into each of those chunk counts (the schedule's own partition: uniform,
or balanced with its alpha) and prints one row per count (``--json``: a list
under ``"sweep"``), to choose the count: more chunks shrink the bubble and the
activations, and under the flops model every extra backward pays its gradient
accumulation (docs/cost-model.md). ``--extra-warmup E [E ...]`` sweeps a 1f1b
schedule's ``pipeline.extra_warmup`` the same way (with ``--chunks``, every
pair): more warm-up forwards keep a bottleneck upstream stage busy at the cost
of ``E`` chunks of activations ([Note: extra warm-up] in lowering/orders.py).
``--split-backward`` applies to every row, and the table says for each whether
it splits. Every variant is made with :func:`schedlang.compiler.revise`, so it
is checked as the file would be had it been written with those values.
"""

from __future__ import annotations

import argparse
import sys

from schedlang.commands.common import (
    add_cost_model_arguments,
    check_hardware_arguments,
    compile_legal,
    cost_settings_from_arguments,
)
from schedlang.commands.simulate_fit import (
    GIB,
    add_fit_arguments,
    check_fit_arguments,
    document_pieces_rows,
    host_budget_text,
    host_memory_fields,
    padding_line,
    run_fit,
)
from schedlang.outputs import strict_json
from schedlang.vocabulary.wording import counted

HELP = "simulate the schedule: makespan, bubble fraction, activations and memory per stage (--fit: longest sequence)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    parser.add_argument(
        "--chunks", type=int, nargs="+", metavar="N",
        help="simulate the schedule re-cut into each of these chunk counts, one row each",
    )
    parser.add_argument(
        "--extra-warmup", type=int, nargs="+", metavar="E",
        help="simulate a 1f1b schedule with each of these pipeline.extra_warmup values, one row each",
    )
    parser.add_argument(
        "--split-backward", action="store_true",
        help="simulate as if pipeline.split_backward = true: weight gradients as W tasks of their own "
        "(gpipe and 1f1b orders only)",
    )
    add_cost_model_arguments(parser)
    add_fit_arguments(parser)


def memory_fields(memory) -> list[dict]:
    """The ``memory`` field: one object per stage of the memory pass's product, bytes in GiB."""
    return [
        {
            **{component.value: value / GIB for component, value in stage.components.items()},
            "allocated": stage.allocated / GIB,
            "reserved": stage.reserved / GIB,
            "chunks_in_flight": stage.chunks_in_flight,
            "peak_task": None if stage.peak_task is None else str(stage.peak_task),
            "pinned_host": stage.pinned_host / GIB,
        }
        for stage in memory
    ]


def host_fields(program, memory, budget) -> dict:
    """The ``host_memory`` field: the budget, each node's pinned host bytes (GiB) and what does not fit there."""
    from schedlang.lowering.memory_budget import MemoryPlace

    misfits = [misfit for misfit in budget.misfits(program, memory) if misfit.place is MemoryPlace.HOST]
    return {
        **host_memory_fields(budget),
        "nodes_pinned_gib": [value / GIB for value in budget.node_pinned_bytes(program, memory)],
        "does_not_fit": [
            {"node": misfit.node, "stage": misfit.stage.stage, "needed_gib": misfit.needed / GIB,
             "limit_gib": misfit.limit / GIB, "term": misfit.term, "message": misfit.describe()}
            for misfit in misfits
        ],
    }


def print_host_memory(result: dict, budget) -> None:
    """Each stage's pinned host memory and each node's sum against the budget (printed only with offload)."""
    print(f"{'pinned host, GiB':<24}" + "".join(f"  {row['pinned_host']:>10.3f}" for row in result["memory"]))
    host = result["host_memory"]
    nodes = ", ".join(f"node {node}: {value:.3f}" for node, value in enumerate(host["nodes_pinned_gib"]))
    print(f"pinned host memory per node, GiB: {nodes}; each may take {host_budget_text(budget)}")


def print_memory_table(memory: list[dict]) -> None:
    """Each stage's predicted peak, component by component, in GiB: one column per stage."""
    from schedlang.lowering.memory_peak import RESERVED_PER_ALLOCATED, Component

    columns = "".join(f"  {f'stage {stage}':>10}" for stage in range(len(memory)))
    print(f"{'memory at the peak, GiB':<24}{columns}")
    for name in [component.value for component in Component] + ["allocated"]:
        print(f"{name:<24}" + "".join(f"  {row[name]:>10.3f}" for row in memory))
    print(f"{f'reserved (x{RESERVED_PER_ALLOCATED:g})':<24}" + "".join(f"  {row['reserved']:>10.3f}" for row in memory))
    print(f"{'chunks in flight':<24}" + "".join(f"  {row['chunks_in_flight']:>10}" for row in memory))
    print(f"{'peak during':<24}" + "".join(f"  {row['peak_task'] or 'step end':>10}" for row in memory))


def simulate_program(program, args: argparse.Namespace, budget=None) -> dict | None:
    """Simulate one checked program under the cost model the arguments name; the JSON fields of the module doc
    (``host_memory`` against ``budget``, a :class:`~schedlang.lowering.memory_budget.MemoryBudget`, when given).
    None after printing why the program is illegal."""
    from schedlang.compiler import Pass
    from schedlang.lowering.cost import CostModelKind
    from schedlang.lowering.memory import stateflow_makespan, stateflow_peak_activations
    from schedlang.lowering.timeline import Stream

    from schedlang.preflight import with_document_pieces

    program = with_document_pieces(program)
    cost = cost_settings_from_arguments(args)
    compilation = compile_legal(program, Pass.COST, cost)
    if compilation is None:
        return None
    from schedlang.lowering.hardware_profile import HardwareProfile, model_parts

    kind, orders, timeline = cost.kind, compilation.orders, compilation.timeline
    profile = cost.hardware if isinstance(cost.hardware, HardwareProfile) else None
    busy = [0.0] * program.n_stages
    for interval in timeline.tasks:
        if interval.stream is Stream.COMPUTE:
            busy[interval.task.stage] += interval.duration
    return {
        "file": str(args.file),
        "cost_model": "profile" if profile is not None else kind.value,
        "time_unit": "full-sequence forward" if kind is CostModelKind.UNIT else "second",
        "hardware": profile.describe(model_parts(program.model)) if profile is not None else None,
        "order": program.pipeline.order.value,
        "extra_warmup": program.pipeline.extra_warmup,
        "split_backward": program.pipeline.split_backward,
        "forward_before_weight": program.pipeline.forward_before_weight,
        "extra_deferred_weights": program.pipeline.extra_deferred_weights,
        "n_stages": program.n_stages,
        "n_microbatches": program.n_microbatches,
        "n_chunks": program.n_chunks,
        "n_tasks": sum(len(order) for order in orders),
        "makespan": timeline.makespan,
        "bubble_fraction": timeline.bubble_fraction,
        "busy_time": busy,
        "gradient_reduction": list(timeline.gradient_reductions),
        "peak_activations": list(timeline.peak_activations),
        "eq13_peak_activations": list(
            stateflow_peak_activations(
                program.n_stages,
                program.n_microbatches,
                program.n_chunks,
                program.pipeline.extra_warmup,
                program.pipeline.split_backward,
                program.pipeline.extra_deferred_weights,
            )
        ),
        "eq15_makespan_unit": stateflow_makespan(program.n_stages, program.n_microbatches, program.n_chunks),
        "memory": memory_fields(compilation.memory),
        "host_memory": None if budget is None else host_fields(program, compilation.memory, budget),
        "document_pieces": document_pieces_rows(program.document_pieces),
    }


def host_misfit_errors(result: dict, args: argparse.Namespace, variant: str = "") -> list[str]:
    """One error per node whose pinned host memory does not fit ([] when every node fits, or no budget);
    ``variant`` names a swept row."""
    host = result.get("host_memory")
    if not host:
        return []
    return [
        f"schedlang simulate: error: {args.file}{variant}: does not fit the host: {misfit['message']}\n"
        "  hint: recompute = full saves only each chunk's input and needs no offload; or train fewer tokens per "
        "sequence, or give the node's real memory with --host-memory"
        for misfit in host["does_not_fit"]
    ]




PEAK_ACTIVATIONS_UNIT = "peak activations: in microbatch sequences (1 = one microbatch's activations, whole length)"

FIXED_COST_TASKS_PER_LATENCY = 10
"""The flops model is called too coarse when its mean compute task lasts less than this many per-message
latencies: the bubble is then made by the fixed per-message cost, not by the order."""


def fixed_cost_note(result: dict, hardware) -> str | None:
    """A note when the flops model's tasks are so short that its fixed per-message latency makes the bubble
    (tiny models: microsecond tasks beside a 10 us latency); None for the unit model or long enough tasks."""
    from schedlang.lowering.cost import CostModelKind

    if result["cost_model"] != CostModelKind.FLOPS.value or result["n_tasks"] == 0:
        return None
    mean_task = sum(result["busy_time"]) / result["n_tasks"]
    if mean_task >= FIXED_COST_TASKS_PER_LATENCY * hardware.latency_s:
        return None
    return (
        f"note: a task lasts {mean_task * 1e6:.3g} us on average, under {FIXED_COST_TASKS_PER_LATENCY} times the "
        f"{hardware.latency_s * 1e6:.3g} us per message (--latency):\n"
        "  the model is too small for the flops model: fixed message costs, not the order, make most of the bubble;\n"
        "  --cost-model unit shows the order's own bubble"
    )


def with_split_backward(program, args: argparse.Namespace):
    """The program as ``--split-backward`` asks (unchanged without it), or None after printing why it cannot."""
    from schedlang.compiler import revise
    from schedlang.vocabulary import OrderKind

    if not args.split_backward or program.pipeline.split_backward:
        return program
    if program.pipeline.order is OrderKind.EXPLICIT:
        print(
            f"schedlang simulate: error: {args.file}: --split-backward applies to order = gpipe or 1f1b; an explicit "
            "order lists its own tasks: set split_backward = true in the pipeline block and write its W tasks",
            file=sys.stderr,
        )
        return None
    return revise(program, split_backward=True)


def sweep(program, args: argparse.Namespace, budget=None) -> list[dict] | None:
    """One result per (``--chunks`` count, ``--extra-warmup`` value), or None after printing why one cannot be
    simulated. A flag left out keeps the schedule's own value; ``program`` is already split as
    ``--split-backward`` asks."""
    from schedlang.compiler import revise
    from schedlang.diagnostics import ScheduleError
    from schedlang.lowering.partition import recut
    from schedlang.vocabulary import OrderKind

    extras = args.extra_warmup or [program.pipeline.extra_warmup]
    if args.extra_warmup and program.pipeline.order is not OrderKind.ONE_F_ONE_B:
        print(
            f"schedlang simulate: error: {args.file}: --extra-warmup applies to order = 1f1b, "
            f"but the schedule's order is {program.pipeline.order.value}",
            file=sys.stderr,
        )
        return None
    results = []
    for n_chunks in args.chunks or [None]:
        changes = {}
        if n_chunks is not None:
            try:
                recut(program, n_chunks)  # refuses a schedule written for one chunk count, or too many chunks
            except ValueError as error:
                message = f"schedlang simulate: error: {args.file}: cannot simulate {n_chunks} chunks: {error}"
                print(message, file=sys.stderr)
                return None
            changes["chunks"] = n_chunks
        for extra in extras:
            if args.extra_warmup:
                changes["extra_warmup"] = extra
            try:
                variant = revise(program, **changes)
            except ScheduleError as error:
                print(error.render(), file=sys.stderr)
                return None
            result = simulate_program(variant, args, budget)
            if result is None:
                return None
            results.append(result)
    return results


def print_sweep(results: list[dict], args: argparse.Namespace) -> None:
    first = results[0]
    print(
        f"{args.file}: {counted(first['n_stages'], 'stage')} x "
        f"{counted(first['n_microbatches'], 'microbatch', 'microbatches')}, order {first['order']}, "
        f"cost model {first['cost_model']} (time in {first['time_unit']}s), swept"
    )
    if first["hardware"]:
        print(first["hardware"])
    note = fixed_cost_note(first, cost_settings_from_arguments(args).hardware)
    if note:
        print(note)
    print(
        f"{'chunks':>6}  {'extra warm-up':>13}  {'split backward':>14}  {'makespan':>12}  {'vs first':>8}  "
        f"{'bubble':>7}  {'peak activations (stage 0)':>26}"
    )
    best = min(range(len(results)), key=lambda index: results[index]["makespan"])
    for index, result in enumerate(results):
        split = "yes" if result["split_backward"] else "no"
        print(
            f"{result['n_chunks']:>6}  {str(result['extra_warmup']):>13}  {split:>14}  {result['makespan']:>12.6g}  "
            f"{result['makespan'] / first['makespan']:>8.3f}  {result['bubble_fraction']:>7.4f}  "
            f"{result['peak_activations'][0]:>26.4g}" + ("  <- shortest" if index == best and len(results) > 1 else "")
        )
    print(PEAK_ACTIVATIONS_UNIT)
    for result in results:
        variant = f" ({result['n_chunks']} chunks, extra_warmup = {result['extra_warmup']})"
        for error in host_misfit_errors(result, args, variant):
            print(error, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    check_hardware_arguments(args, "simulate")
    if args.chunks is not None and min(args.chunks) < 1:
        raise SystemExit(f"schedlang simulate: error: --chunks must be positive, got {min(args.chunks)}")
    if args.extra_warmup is not None and min(args.extra_warmup) < 0:
        raise SystemExit(f"schedlang simulate: error: --extra-warmup must be at least 0, got {min(args.extra_warmup)}")
    from schedlang.compiler import Pass
    from schedlang.frontend import load_program

    budget = check_fit_arguments(args)
    program = load_program(args.file)
    if compile_legal(program, Pass.LEGALITY) is None:
        return 1
    if program.train.data.document_end is not None:  # the padding bound reads the data
        from schedlang.frontend import read_source
        from schedlang.preflight import check_data_file

        check_data_file(program, read_source(args.file))
    program = with_split_backward(program, args)
    if program is None:
        return 1
    if args.fit:
        return run_fit(program, args, budget)
    if args.chunks or args.extra_warmup:
        results = sweep(program, args, budget)
        if results is None:
            return 1
        if args.json:
            print(strict_json({"file": str(args.file), "sweep": results}))
        else:
            print_sweep(results, args)
        return 1 if any(host_misfit_errors(result, args) for result in results) else 0
    result = simulate_program(program, args, budget)
    if result is None:
        return 1
    errors = host_misfit_errors(result, args)
    if args.json:
        print(strict_json(result))
        return 1 if errors else 0
    print(
        f"{args.file}: {counted(program.n_stages, 'stage')} x "
        f"{counted(program.n_microbatches, 'microbatch', 'microbatches')} x {counted(program.n_chunks, 'chunk')}, "
        f"order {result['order']}"
        + (", split backward" if program.pipeline.split_backward else "")
        + f", cost model {result['cost_model']} (time in {result['time_unit']}s)"
    )
    if result["hardware"]:
        print(result["hardware"])
    print(f"makespan {result['makespan']:.6g}   bubble fraction {result['bubble_fraction']:.4f}")
    note = fixed_cost_note(result, cost_settings_from_arguments(args).hardware)
    if note:
        print(note)
    reductions = result["gradient_reduction"] if any(result["gradient_reduction"]) else None
    reduction_header = f"  {'gradient all-reduce':>19}" if reductions else ""
    print(f"{'stage':>5}  {'busy':>12}{reduction_header}  {'peak activations':>16}")
    for stage in range(program.n_stages):
        reduction = f"  {reductions[stage]:>19.6g}" if reductions else ""
        print(f"{stage:>5}  {result['busy_time'][stage]:>12.6g}{reduction}  {result['peak_activations'][stage]:>16.4g}")
    print(PEAK_ACTIVATIONS_UNIT)
    print_memory_table(result["memory"])
    if program.pipeline.offload:
        print_host_memory(result, budget)
    for row in result["document_pieces"] or ():
        print(padding_line(row))
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0
