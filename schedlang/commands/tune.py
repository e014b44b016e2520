"""``schedlang tune FILE``: the fastest schedules the language can say for this model that fit the device.

Searches the space of :mod:`schedlang.tuning.space` (chunks and partition, recompute per stage, offload, CUDA
graphs, the 1F1B warm-up, split backward and the placement of ``W``, the stage split, the microbatches at the
file's global batch, the sequence-parallel method, and with ``--world W`` the mesh) by the pruned search of
:mod:`schedlang.tuning.search`: every candidate is the file revised by :func:`schedlang.compiler.revise` and
compiled through the cost pass, so ``check`` accepts it, and every stage's predicted reserved peak fits
``--device-memory`` and, where it offloads, every node's pinned host memory fits its share of ``--host-memory``
(the hardware profile's ``[host]`` by default; :mod:`schedlang.lowering.memory_budget`). Prints the ``--top`` fastest (predicted step time, tokens/s, reserved peak per stage,
what differs from the file), with progress on standard error; ``--json`` prints them as an object. With
``-o OUT`` the fastest is written as a schedule file: the file's text with the changed keys rewritten in place
(comments and the order of the other keys kept) and its relative paths moved to OUT's directory; an existing
OUT is replaced only with ``--force``, and never the input.

``--length L`` tunes for sequences of L tokens; ``--fit`` for the longest multiple of ``--step`` up to
``--max-length`` at which anything of the space fits (memory only, as ``simulate --fit`` searches lengths),
then tunes there. ``--device cpu`` leaves out CUDA graphs, so the pick trains on the CPU. Time comes from the
``flops`` cost model and its hardware options, or with ``--hardware PROFILE`` from a hardware profile's measured
curves and links (docs/cost-model.md). Exits 1 when nothing fits, naming the stage (or the node, for host memory)
and the memory term that bind.
"""

from __future__ import annotations

import argparse
import sys
import time

from schedlang.commands.common import add_cost_model_arguments, check_hardware_arguments, cost_settings_from_arguments
from schedlang.commands.simulate_fit import (
    DEFAULT_DEVICE_MEMORY,
    DEFAULT_MAX_LENGTH,
    DEFAULT_STEP,
    GIB,
    add_host_memory_argument,
    host_budget_text,
    length_flags_problem,
    longest_true,
    read_memory_budget,
)
from schedlang.limits import MAX_RANKS
from schedlang.outputs import strict_json, whole_file_problem, write_output_file

HELP = "search chunks, recompute, warm-up, split backward, stages, microbatches and mesh for the fastest that fit"

DEFAULT_TOP = 5
DEFAULT_MAX_CHUNKS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument("-o", "--output", default=None, help="write the fastest candidate here as a schedule file")
    parser.add_argument("--force", action="store_true", help="replace an existing -o file")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="K", help="candidates to print (default 5)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    parser.add_argument(
        "--device-memory", default=DEFAULT_DEVICE_MEMORY, metavar="SIZE",
        help=f"one device's memory, like 80GB or 141GiB (default {DEFAULT_DEVICE_MEMORY}, an H200)",
    )
    add_host_memory_argument(parser)
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument("--length", type=int, default=None, metavar="TOKENS", help="tune for this sequence length")
    lengths.add_argument(
        "--fit", action="store_true", help="tune at the longest sequence (a multiple of --step) that fits at all"
    )
    parser.add_argument("--step", type=int, default=DEFAULT_STEP, metavar="TOKENS", help="with --fit: length step")
    parser.add_argument(
        "--max-length", type=int, default=DEFAULT_MAX_LENGTH, metavar="TOKENS", help="with --fit: longest length tried"
    )
    parser.add_argument("--world", type=int, default=None, metavar="W",
                        help="also choose the mesh: every pipeline x sequence x data = W")
    parser.add_argument("--max-chunks", type=int, default=DEFAULT_MAX_CHUNKS, metavar="N",
                        help=f"most chunks tried, powers of two (default {DEFAULT_MAX_CHUNKS})")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="what the schedule will run on: cpu leaves out CUDA graphs (default cuda)")
    parser.add_argument("--dominated", action="store_true",
                        help="also list candidates slower than a listed one and no smaller on any stage")
    parser.add_argument("--exhaustive", action="store_true",
                        help="simulate every candidate of the space, without pruning (slow; to check the pruning)")
    add_cost_model_arguments(parser)  # --cost-model (tune's default: flops), --hardware and the flops options


def _fail(message: str) -> SystemExit:
    return SystemExit(f"schedlang tune: error: {message}")


def check_arguments(args: argparse.Namespace):
    """The memory budget (:class:`~schedlang.lowering.memory_budget.MemoryBudget`); refuses bad flags before any
    work (a bad size at its column)."""
    check_hardware_arguments(args, "tune")  # reads --hardware, refuses it beside --cost-model
    if args.cost_model not in (None, "flops"):
        raise _fail(f"--cost-model {args.cost_model} has no seconds to rank by; tune times with the flops model "
                    "(or --hardware PROFILE)")
    for flag, value in (("--top", args.top), ("--world", args.world)):
        if value is not None and value < 1:
            raise _fail(f"{flag} must be positive, got {value}")
    if args.world is not None and args.world > MAX_RANKS:
        raise _fail(f"--world {args.world} is more than the limit of {MAX_RANKS} ranks a mesh may have")
    problem = length_flags_problem(args, "tune")
    if problem:
        raise SystemExit(problem)
    if args.output == "-" and args.json:
        raise _fail("-o - prints the schedule on standard output, where --json prints its object; choose one")
    problem = whole_file_problem(args.output, args.force) if args.output is not None else None
    if problem:
        raise _fail(problem)
    return read_memory_budget(args, f"schedlang tune {args.file}")


def cost_settings(args: argparse.Namespace):
    """The cost model tune times with: the profile model of ``--hardware``, else the flops model with the
    hardware options (tune's default, where simulate's is unit)."""
    from schedlang.compiler import CostSettings
    from schedlang.lowering.cost import CostModelKind

    settings = cost_settings_from_arguments(args)
    if args.hardware is None:
        return CostSettings(CostModelKind.FLOPS, settings.hardware)
    return settings


class Progress:
    """One line on standard error, rewritten in place on a terminal; elsewhere one line per phase."""

    def __init__(self, stream=None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.terminal = self.stream.isatty()
        self.last_phase, self.last_time = None, 0.0

    def __call__(self, phase: str, done: int, total: int, simulated: int, best: float | None) -> None:
        now = time.monotonic()
        if phase == self.last_phase and now - self.last_time < 0.2 and done < total:
            return
        best_text = "" if best is None else f", best step {best:.4g} s"
        line = f"tune: {phase} {done}/{total}, {simulated} simulated{best_text}"
        if self.terminal:
            self.stream.write("\r" + line.ljust(79) + ("\n" if phase == "done" else ""))
        elif phase != self.last_phase:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.last_phase, self.last_time = phase, now


def fit_length(program, settings, args) -> int | None:
    """The longest multiple of ``--step`` up to ``--max-length`` at which some layout fits (memory only)."""
    from schedlang.tuning.search import fits_at

    length, _ = longest_true(lambda steps: fits_at(program, settings, steps * args.step), args.max_length // args.step)
    return length * args.step or None


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from schedlang.frontend import load_program
    from schedlang.lowering.profile_cost import MissingMeasurementError
    from schedlang.preflight import check_data_file
    from schedlang.tuning.search import TuneSettings, search

    budget = check_arguments(args)
    program = load_program(args.file)
    settings = TuneSettings(
        cost=cost_settings(args), device_memory=budget.device_bytes, world=args.world, length=args.length,
        max_chunks=args.max_chunks, device=args.device, top=args.top, prune=not args.exhaustive,
        dominated=args.dominated, host_memory=budget.host.memory_bytes,
    )
    if args.world is not None and program.pipeline.order.value == "explicit":
        raise _fail(f"{args.file}: --world chooses the mesh, but an explicit order is written for its own mesh")
    started = time.monotonic()
    if args.fit:
        length = fit_length(program, settings, args)
        if length is None:
            print(f"schedlang tune: error: {args.file}: not even {args.step} tokens fit "
                  f"{budget.device_bytes / GIB:.1f} GiB and {host_budget_text(budget)}", file=sys.stderr)
            return 1
        settings = replace(settings, length=length)
    try:
        result = search(program, settings, Progress())
    except MissingMeasurementError as error:
        raise _fail(f"{args.file}: {error}") from None
    seconds = time.monotonic() - started
    if not result.candidates:
        print(nothing_fits(args, result, budget), file=sys.stderr)
        return 1
    check_data_file(result.candidates[0].program, result.candidates[0].program.source_text)  # as check does
    written = write_best(args, program, result.candidates[0]) if args.output else None
    if args.json:
        print(strict_json(as_json(args, result, budget, seconds, written)))
    else:
        print_table(args, result, budget, seconds, written)
    return 0


def nothing_fits(args, result, budget) -> str:
    """Why nothing fits: the checker's first refusal, or the nearest miss's binding stage (node) and term."""
    from schedlang.lowering.memory_budget import MemoryPlace

    miss = result.nearest_miss
    if miss is None:
        first = ("" if result.first_refusal is None
                 else "; the first, in its revised text:\n" + result.first_refusal.render())
        return f"schedlang tune: error: {args.file}: the checker refuses every candidate of the space{first}"
    host_miss = result.nearest_host_miss
    space = f"{budget.device_bytes / GIB:.1f} GiB"
    if host_miss is not None:
        space += f" per device and {host_budget_text(budget)}"
    message = (
        f"schedlang tune: error: {args.file}: nothing in the space fits {space} at {result.length} tokens; the "
        f"nearest ({miss.description}) {miss.misfit.describe()}"
    )
    if miss.misfit.place is MemoryPlace.HOST:
        hint = "a larger --host-memory (the node's real memory), a shorter --length, or a larger --device-memory"
    else:
        hint = "a larger --device-memory, a shorter --length, or a --world with more pipeline stages"
        if host_miss is not None:  # offload fitted some device, and the host refused it
            message += (f"; of those that fit their devices, the nearest ({host_miss.description}) "
                        f"{host_miss.misfit.describe()}")
            hint += "; or, where the node has it, a larger --host-memory"
    return f"{message}\n  hint: {hint}"


def write_best(args, program, best) -> str:
    """Write the pick to ``-o`` (:mod:`schedlang.tuning.writing`; ``-`` prints it); the text is checked again and
    must give the pick's program, else the revised text is written as is. Returns where it went."""
    from dataclasses import replace

    from schedlang.compiler import Pass, ScheduleText, compile_schedule
    from schedlang.outputs import STANDARD_OUTPUT
    from schedlang.tuning.writing import relocated_text, tuned_text

    text = tuned_text(program.source_text, program.source_file, dict(best.change_values))
    written = compile_schedule(ScheduleText(text, program.source_file), through=Pass.CHECK).program
    if written != replace(best.program, document_pieces=None):
        text = best.program.source_text
    if args.output == STANDARD_OUTPUT:
        sys.stdout.write(text)
    else:
        write_output_file(args.output, relocated_text(text, program.source_file, args.output))
    return args.output


def _changes_text(candidate) -> str:
    return ", ".join(f"{name} = {value}" for name, value in candidate.changes) or "(the file as written)"


def hardware_line(settings, model) -> str:
    """Which cost model timed the candidates: the profile's own description (with what it prices from other
    parts for ``model``), or the flops model's figures."""
    from schedlang.lowering.hardware_profile import HardwareProfile, model_parts

    hardware = settings.cost.hardware
    if isinstance(hardware, HardwareProfile):
        return hardware.describe(model_parts(model))
    return (f"cost model flops: {hardware.throughput_flops:.3g} FLOP/s, links {hardware.latency_s:.3g} s + bytes / "
            f"{hardware.bandwidth_bytes_per_s:.3g} B/s, kernel gap {hardware.kernel_gap_s:.3g} s")


def as_json(args, result, budget, seconds: float, written) -> dict:
    from schedlang.commands.simulate_fit import host_memory_fields

    stats = result.stats
    return {
        "file": str(args.file),
        "cost_model": hardware_line(result.settings, result.candidates[0].program.model),
        "length": result.length,
        "device_memory_gib": budget.device_bytes / GIB,
        "host_memory": host_memory_fields(budget),
        "seconds": seconds,
        "search": dict(vars(stats)),
        "candidates": [
            {
                "rank": rank,
                "step_seconds": candidate.makespan,
                "tokens_per_second": candidate.tokens_per_second,
                "reserved_gib": [value / GIB for value in candidate.reserved],
                "pinned_host_gib": [stage.pinned_host / GIB for stage in candidate.memory],
                "host_bound_share": candidate.host_bound_share,
                "changes": dict(candidate.changes),
                "schedule": candidate.program.source_text,
            }
            for rank, candidate in enumerate(result.candidates, start=1)
        ],
        "written": written,
    }


def print_table(args, result, budget, seconds: float, written) -> None:
    from schedlang.lowering.memory_budget import OUTSIDE_THE_ALLOCATOR

    stats = result.stats
    if written == "-":
        return  # the schedule went to standard output
    print(
        f"{args.file}: {result.length} tokens per sequence, {budget.device_bytes / GIB:.1f} GiB per device; "
        f"{stats.layouts} layouts ({stats.refused} refused by the checker, {stats.explored} explored, "
        f"{stats.bounded_out} bounded out), {stats.simulated} simulated, {stats.compiled} compiled in {seconds:.1f} s; "
        f"each stage's reserved peak fits with {OUTSIDE_THE_ALLOCATOR / GIB:g} GiB outside the allocator, "
        f"and each node's offloaded activations fit {host_budget_text(budget)}"
    )
    print(hardware_line(result.settings, result.candidates[0].program.model))
    print(f"{'rank':>4}  {'step s':>10}  {'tokens/s':>12}  {'reserved GiB per stage':>24}  {'host GiB':>8}  "
          f"{'host-bound':>10}  changes from the file")
    for rank, candidate in enumerate(result.candidates, start=1):
        peaks = " / ".join(f"{value / GIB:.2f}" for value in candidate.reserved)
        nodes = budget.node_pinned_bytes(candidate.program, candidate.memory)
        host = f"{max(nodes) / GIB:.2f}" if any(nodes) else "-"
        bound = f"{candidate.host_bound_share:.0%}" if candidate.host_bound_share else "-"
        print(f"{rank:>4}  {candidate.makespan:>10.4g}  {candidate.tokens_per_second:>12,.0f}  {peaks:>24}  "
              f"{host:>8}  {bound:>10}  {_changes_text(candidate)}")
    if any(candidate.host_bound_share for candidate in result.candidates):
        print("host-bound: the share of the busiest stage's task time that the profile prices as the host's eager "
              "launches; such a time holds for the host the profile was calibrated on (schedlang profile "
              "--calibrate on this machine)")
    if written:
        print(f"wrote {written} (rank 1; check it with: schedlang check {written})")
