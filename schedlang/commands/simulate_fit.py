"""``schedlang simulate FILE --fit``: the longest sequence that fits the device, its chunk count and tokens/s.

For lengths that are multiples of ``step`` up to ``--max-length`` and chunk counts ``1, 2, 4, ...`` up to
``--max-chunks`` (each chunk a whole number of ``sequence.kernel_chunk`` tokens), every candidate is the
schedule revised by :func:`schedlang.compiler.revise` (so checked as the file would be; with packed documents,
its padding measured for its chunk lengths: schedlang.preflight.with_document_pieces) and compiled through
the cost pass under the ``flops`` model with the hardware options given; it fits when the memory budget finds no
misfit (:class:`schedlang.lowering.memory_budget.MemoryBudget`): every stage's predicted reserved peak
(:mod:`schedlang.lowering.memory_peak`) plus ``OUTSIDE_THE_ALLOCATOR`` at most ``--device-memory`` and, with
``pipeline.offload``, every node's pinned host bytes within ``--host-memory``'s pinned share. A length fits when one of its chunk counts does; the predicted peak grows with the length
at each chunk count, so the search asks at ``step``, ``2 step``, ``4 step``, ... until a length does not fit
(or ``--max-length`` does), then bisects in steps of ``--step``: about ``2 log2(max_length / step)`` lengths
rather than every one. The proposal is the longest length found whose next step does not fit, with its fastest
fitting chunk count (predicted tokens per second: the step's tokens over the simulated makespan). Everything else of the schedule (model, mesh, microbatches,
order, recompute, and ``--split-backward`` when given) stays as written.

With ``--fit-recompute`` the search also chooses ``pipeline.recompute``, stage by stage: each candidate is
first compiled under every mode; a stage's peak depends only on its own mode, so each stage takes, of the
modes under which its peak fits, the one whose schedule simulated fastest, and the candidate is the schedule
with those modes (one mode when every stage chose the same). A candidate whose stages cannot all fit is
the ``full`` one (the smallest peaks). Offloading stages of one node share its host memory, so where the
stages' choices together do not fit it, the candidate is the fastest single mode that fits whole.

``--device-memory`` reads a number and a unit (``80GB``, ``141GiB``, ``1.5TiB``, ``512MiB``); the default is
what torch reports for an H200 (:data:`DEFAULT_DEVICE_MEMORY`). ``--host-memory`` reads a node's host RAM the
same way; the default is the hardware profile's ``[host]`` memory, else
:data:`~schedlang.lowering.hardware_profile.DEFAULT_HOST_MEMORY_BYTES`. A size it cannot read is reported at
its column of the command line, with a caret. :func:`read_memory_budget` reads both, for ``simulate`` and
``tune`` alike.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from schedlang.vocabulary import Recompute, StageRecompute, recompute_text

if TYPE_CHECKING:  # imported where used: every command's parser is built from this module's arguments
    from schedlang.lowering.memory_budget import MemoryBudget

GIB = 2**30

SIZE_UNITS = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)")

DEFAULT_DEVICE_MEMORY = "140GiB"
"""An H200's memory as ``torch.cuda.get_device_properties().total_memory`` reports it (about 140.4 GiB; the
"141 GB" of the data sheet is decimal), rounded down."""

DEFAULT_STEP = 16384
DEFAULT_MAX_LENGTH = 16777216
DEFAULT_MAX_CHUNKS = 256
MAX_FIT_LENGTHS = 1 << 16  # lengths --max-length / --step names; packed documents measure each one's chunks


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fit", action="store_true",
        help="print the longest sequence (and its chunk count and tokens/s) whose predicted peak fits "
        "--device-memory on every stage; timed under the flops model",
    )
    parser.add_argument(
        "--device-memory", default=DEFAULT_DEVICE_MEMORY, metavar="SIZE",
        help=f"with --fit: one device's memory, like 80GB or 141GiB (default {DEFAULT_DEVICE_MEMORY}, an H200)",
    )
    add_host_memory_argument(parser)
    parser.add_argument(
        "--step", type=int, default=DEFAULT_STEP, metavar="TOKENS",
        help=f"with --fit: try sequence lengths in multiples of this (default {DEFAULT_STEP})",
    )
    parser.add_argument(
        "--max-length", type=int, default=DEFAULT_MAX_LENGTH, metavar="TOKENS",
        help=f"with --fit: the longest sequence tried (default {DEFAULT_MAX_LENGTH})",
    )
    parser.add_argument(
        "--max-chunks", type=int, default=DEFAULT_MAX_CHUNKS, metavar="N",
        help=f"with --fit: the most chunks tried, powers of two (default {DEFAULT_MAX_CHUNKS})",
    )
    parser.add_argument(
        "--fit-recompute", action="store_true",
        help="with --fit: also choose each stage's recompute mode (the fastest whose peak fits)",
    )


HOST_MEMORY_HELP = (
    "one node's host memory, like 512GiB, which pipeline.offload's pinned copies share (default: the --hardware "
    "profile's [host] memory, else 128GiB; pinned copies may take its pinned_fraction of it, else 75%%)"
)
"""The defaults it names are schedlang.lowering.hardware_profile's, written out so that building the parser
imports no lowering (tests/lowering/test_memory_budget.py holds them equal)."""


def add_host_memory_argument(parser: argparse.ArgumentParser) -> None:
    """``--host-memory SIZE``: one node's host RAM, which offloaded activations share (``simulate`` and ``tune``)."""
    parser.add_argument("--host-memory", default=None, metavar="SIZE", help=HOST_MEMORY_HELP)


class SizeError(ValueError):
    """A size that cannot be read, with the half-open character range of the offending text."""

    def __init__(self, message: str, start: int, end: int) -> None:
        super().__init__(message)
        self.start, self.end = start, end


def parse_size(text: str) -> int:
    """Bytes of a size written as a number and a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; any case)."""
    match = SIZE.fullmatch(text.strip())
    offset = len(text) - len(text.lstrip())
    if match is None:
        bad = re.match(r"\s*\d+(?:\.\d+)?\s*", text)
        start = bad.end() if bad and bad.end() < len(text) else offset
        raise SizeError("a size is a number and a unit, like 80GB or 141GiB", start, len(text.rstrip()))
    unit = match.group("unit")
    if unit.upper() not in SIZE_UNITS:
        start = offset + match.start("unit")
        known = ", ".join(("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
        raise SizeError(f"unknown unit '{unit}': write one of {known}", start, start + max(len(unit), 1))
    size = float(match.group("number")) * SIZE_UNITS[unit.upper()]
    if size <= 0:
        raise SizeError("a memory size must be positive", offset, len(text.rstrip()))
    return int(size)


def read_size_flag(text: str, flag: str, command: str) -> int:
    """Bytes of ``flag``'s ``text``, or exit with the size's error at its column of ``command flag text``."""
    from schedlang.vocabulary import Span, render_message

    try:
        return parse_size(text)
    except SizeError as error:
        prefix = f"{command} {flag} "
        start, end = len(prefix) + error.start + 1, len(prefix) + max(error.end, error.start + 1) + 1
        span = Span("<command line>", 1, start, 1, end)
        raise SystemExit(render_message(span, f"{flag}: {error}", prefix + text)) from None


def read_memory_budget(args: argparse.Namespace, command: str) -> MemoryBudget:
    """The :class:`MemoryBudget` of ``--device-memory``, ``--host-memory`` and ``--hardware`` (read already by
    ``check_hardware_arguments``); ``command`` is the command line before the flags, for the caret of a bad size."""
    from schedlang.commands.common import load_hardware_option
    from schedlang.lowering.memory_budget import MemoryBudget

    device_memory = read_size_flag(args.device_memory, "--device-memory", command)
    host_memory = None if args.host_memory is None else read_size_flag(args.host_memory, "--host-memory", command)
    return MemoryBudget.of(device_memory, host_memory, load_hardware_option(args, command.split()[1]))


def length_flags_problem(args: argparse.Namespace, command: str) -> str | None:
    """What is wrong with ``--step``, ``--max-length``, ``--max-chunks`` and (where the command has it)
    ``--length``: outside the bounds the checker puts on ``sequence.length`` and ``sequence.chunks``, or more
    lengths than ``MAX_FIT_LENGTHS`` between them; None when they hold. One rule for simulate and tune."""
    from schedlang.checks.sequence import MAX_LENGTH
    from schedlang.limits import MAX_CHUNKS

    flags = [("--step", args.step, MAX_LENGTH), ("--max-length", args.max_length, MAX_LENGTH),
             ("--max-chunks", args.max_chunks, MAX_CHUNKS)]
    if getattr(args, "length", None) is not None:
        flags.append(("--length", args.length, MAX_LENGTH))
    for flag, value, most in flags:
        if not 1 <= value <= most:
            return (f"schedlang {command}: error: {flag} must be in 1 .. {most} (sequence.length's and "
                    f"sequence.chunks' own bounds), got {value}")
    if args.max_length // args.step > MAX_FIT_LENGTHS:
        return (f"schedlang {command}: error: --max-length {args.max_length} in steps of {args.step} gives "
                f"{args.max_length // args.step} lengths, more than {MAX_FIT_LENGTHS}: give a larger --step")
    return None


def check_fit_arguments(args: argparse.Namespace) -> MemoryBudget:
    """The memory budget; refuses bad ``--fit`` options before any work, a bad size at its column."""
    budget = read_memory_budget(args, f"schedlang simulate {args.file}" + (" --fit" if args.fit else ""))
    problem = length_flags_problem(args, "simulate")
    if problem:
        raise SystemExit(problem)
    if args.fit_recompute and not args.fit:
        raise SystemExit("schedlang simulate: error: --fit-recompute chooses recompute modes for --fit; add --fit")
    if args.fit and (args.chunks or args.extra_warmup):
        raise SystemExit("schedlang simulate: error: --fit chooses the chunk count itself; leave out --chunks "
                         "and --extra-warmup (write extra_warmup in the file)")
    return budget


@dataclass(frozen=True)
class Candidate:
    """One (length, chunk count) the search compiled."""

    length: int
    n_chunks: int
    reserved: tuple[float, ...]  # bytes per stage
    makespan: float  # seconds
    tokens_per_step: int
    recompute: StageRecompute  # the schedule's pipeline.recompute in this candidate
    document_pieces: list[dict] | None = None  # packed documents: document_pieces_rows of the candidate
    memory: tuple = field(default=(), compare=False, repr=False)  # the memory pass's StageMemory per stage
    program: object = field(default=None, compare=False, repr=False)  # the revised program

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.makespan if self.makespan > 0 else 0.0

    def misfits(self, budget: MemoryBudget) -> tuple:
        return budget.misfits(self.program, self.memory)

    def fits(self, budget: MemoryBudget) -> bool:
        return not self.misfits(budget)

    def as_json(self) -> dict:
        return {
            "length": self.length,
            "n_chunks": self.n_chunks,
            "reserved_gib": [value / GIB for value in self.reserved],
            "pinned_host_gib": [stage.pinned_host / GIB for stage in self.memory],
            "makespan": self.makespan,
            "tokens_per_second": self.tokens_per_second,
            "recompute": recompute_text(self.recompute),
            "document_pieces": self.document_pieces,
        }


def document_pieces_rows(pieces) -> list[dict] | None:
    """Per chunk length of ``pieces`` (a program's ``document_pieces``) its most document pieces and the
    recurrent operators' padded tokens per sequence, which the figures include; None without packed documents."""
    from schedlang.lowering.operator_tokens import RUNTIME_KERNEL_CHUNK
    from schedlang.runtime.document_padding import most_padded_tokens

    if pieces is None:
        return None
    return [
        {
            "chunk_length": length,
            "pieces": count,
            "operator_tokens": most_padded_tokens(length, count, RUNTIME_KERNEL_CHUNK),
        }
        for length, count in pieces.by_length
    ]


def padding_line(row: dict) -> str:
    """What the printed figures assume of one row of :func:`document_pieces_rows`."""
    return (
        f"packed documents: up to {row['pieces']} pieces in a chunk of {row['chunk_length']} tokens; the figures "
        f"include the recurrent operators' padding to {row['operator_tokens']} tokens per sequence"
    )


def chunk_counts(length: int, kernel_chunk: int, max_chunks: int) -> list[int]:
    """Powers of two up to ``max_chunks`` that cut ``length`` into whole kernel chunks each."""
    counts, count = [], 1
    while count <= max_chunks:
        if length % (count * kernel_chunk) == 0:
            counts.append(count)
        count *= 2
    return counts


def evaluate(program, length: int, n_chunks: int, cost, recompute: StageRecompute | None = None) -> Candidate | None:
    """The candidate's predicted memory and step time (under ``recompute`` when given, else the schedule's
    modes), or None where the checker refuses the variant."""
    from schedlang.commands.common import compile_legal
    from schedlang.compiler import Pass, revise
    from schedlang.diagnostics import ScheduleError
    from schedlang.preflight import with_document_pieces

    changes = {"sequence.length": length, "sequence.chunks": n_chunks}
    if recompute is not None:
        changes["pipeline.recompute"] = recompute
    try:
        variant = revise(program, **changes)
    except ScheduleError:
        return None
    variant = with_document_pieces(variant)  # packed documents: the padding bound of its chunk lengths
    compilation = compile_legal(variant, Pass.COST, cost)
    if compilation is None:
        return None
    memory = compilation.memory
    tokens = variant.n_microbatches * variant.pipeline.microbatch_size * variant.mesh.data * length
    reserved = tuple(stage.reserved for stage in memory)
    return Candidate(
        length,
        n_chunks,
        reserved,
        compilation.timeline.makespan,
        tokens,
        variant.pipeline.recompute,
        document_pieces_rows(variant.document_pieces),
        memory,
        variant,
    )


def evaluate_choosing_recompute(
    program, length: int, n_chunks: int, cost, budget: MemoryBudget
) -> Candidate | None:
    """The candidate with each stage's recompute mode chosen (the module docstring's ``--fit-recompute``)."""
    under = {mode: evaluate(program, length, n_chunks, cost, mode) for mode in Recompute}
    under = {mode: candidate for mode, candidate in under.items() if candidate is not None}
    if not under:
        return None
    chosen = []
    for stage in range(program.n_stages):
        fitting = [
            (candidate.makespan, mode)
            for mode, candidate in under.items()
            if budget.stage_fits(candidate.reserved[stage])
            and budget.stage_fits_host(candidate.memory[stage].pinned_host)
        ]
        if not fitting:
            return under.get(Recompute.FULL) or min(under.values(), key=lambda candidate: max(candidate.reserved))
        chosen.append(min(fitting)[1])
    modes = tuple(chosen)
    combined = under[modes[0]] if len(set(modes)) == 1 else evaluate(program, length, n_chunks, cost, modes)
    if combined is None or combined.fits(budget):
        return combined
    whole = [candidate for candidate in under.values() if candidate.fits(budget)]  # a node's host binds
    return min(whole, key=lambda candidate: candidate.makespan) if whole else combined


@dataclass(frozen=True)
class FitResult:
    proposal: Candidate | None  # the longest length's fastest fitting candidate
    refused: Candidate | None  # the next length's smallest peak, which does not fit (None at the bound)
    tried: tuple[Candidate, ...]


def search(program, args: argparse.Namespace, budget: MemoryBudget) -> FitResult:
    """The longest multiple of ``--step`` up to ``--max-length`` that fits, found by doubling and then bisection
    (see the module docstring)."""
    from schedlang.commands.common import cost_settings_from_arguments
    from schedlang.compiler import CostSettings
    from schedlang.lowering.cost import CostModelKind
    from schedlang.vocabulary import PartitionKind
    from schedlang.preflight import measure_document_pieces

    cost = CostSettings(CostModelKind.FLOPS, cost_settings_from_arguments(args).hardware)
    kernel_chunk = program.sequence.kernel_chunk
    step, most_steps = args.step, args.max_length // args.step
    if program.sequence.partition is PartitionKind.UNIFORM:  # packed documents: one pass over the data for all
        measure_document_pieces(  # the chunk lengths of every length the bisection may visit
            program,
            [
                steps * step // n_chunks
                for steps in range(1, most_steps + 1)
                for n_chunks in chunk_counts(steps * step, kernel_chunk, args.max_chunks)
            ],
        )
    tried: dict[int, list[Candidate]] = {}

    def candidates_at(steps: int) -> list[Candidate]:
        if steps not in tried:
            length = steps * step
            evaluated = (
                evaluate_choosing_recompute(program, length, n_chunks, cost, budget) if args.fit_recompute
                else evaluate(program, length, n_chunks, cost)
                for n_chunks in chunk_counts(length, kernel_chunk, args.max_chunks)
            )
            tried[steps] = [candidate for candidate in evaluated if candidate is not None]
        return tried[steps]

    def fits_at(steps: int) -> bool:
        return any(candidate.fits(budget) for candidate in candidates_at(steps))

    fitting_steps, refused_steps = longest_true(fits_at, most_steps)
    proposal = None
    if fitting_steps:
        fitting = [candidate for candidate in candidates_at(fitting_steps) if candidate.fits(budget)]
        proposal = max(fitting, key=lambda candidate: candidate.tokens_per_second)
    refused = None
    if refused_steps is not None:
        refused = min(candidates_at(refused_steps), key=lambda candidate: max(candidate.reserved), default=None)
    in_order = tuple(candidate for steps in sorted(tried) for candidate in tried[steps])
    return FitResult(proposal, refused, in_order)


def longest_true(holds, most: int) -> tuple[int, int | None]:
    """``(n, n + 1)`` with ``holds(n)`` true and ``holds(n + 1)`` false for ``1 <= n < most``, found by asking
    ``holds`` at 1, 2, 4, ... and then bisecting (``O(log most)`` questions); ``(0, 1)`` when ``holds(1)`` is
    false, ``(most, None)`` when ``holds(most)`` is true. Where ``holds`` is monotone (true up to some ``n``, then
    false) that is the ``n``; otherwise some boundary between a true and a false answer."""
    if most < 1:
        return 0, None
    low, high = 0, None  # holds(low) is true (or low == 0); holds(high) is false
    probe = 1
    while high is None:
        if holds(probe):
            low = probe
            if probe == most:
                return most, None
            probe = min(2 * probe, most)
        else:
            high = probe
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            low = middle
        else:
            high = middle
    return low, high


def refuse_explicit_partition(program) -> str | None:
    """Why the sequence cannot be re-cut, rendered at the key, or None."""
    from schedlang.vocabulary import PartitionKind
    from schedlang.vocabulary import render_message

    if program.sequence.partition is not PartitionKind.EXPLICIT:
        return None
    return render_message(
        program.spans.get("sequence.chunks"),
        "--fit re-cuts the sequence into each length and chunk count, but this schedule places its chunk "
        "boundaries by hand",
        program.source_text,
        hint="write a chunk count (chunks = 4) to let --fit choose",
    )


def run_fit(program, args: argparse.Namespace, budget: MemoryBudget) -> int:
    from schedlang.lowering.memory_budget import OUTSIDE_THE_ALLOCATOR
    from schedlang.outputs import strict_json

    refusal = refuse_explicit_partition(program)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 1
    if args.step % program.sequence.kernel_chunk:
        print(
            f"schedlang simulate: error: --step {args.step} is not a multiple of the schedule's kernel_chunk "
            f"({program.sequence.kernel_chunk}): every length tried must cut into whole kernel chunks",
            file=sys.stderr,
        )
        return 1
    result = search(program, args, budget)
    if args.json:
        print(
            strict_json(
                {
                    "file": str(args.file),
                    "device_memory_gib": budget.device_bytes / GIB,
                    "outside_the_allocator_gib": OUTSIDE_THE_ALLOCATOR / GIB,
                    "host_memory": host_memory_fields(budget),
                    "step": args.step,
                    "max_length": args.max_length,
                    "fits": None if result.proposal is None else result.proposal.as_json(),
                    "next_does_not_fit": None if result.refused is None else result.refused.as_json(),
                    "tried": [candidate.as_json() for candidate in result.tried],
                }
            )
        )
        return 0 if result.proposal is not None else 1
    print_fit(result, args, budget)
    return 0 if result.proposal is not None else 1


def _peaks(candidate: Candidate) -> str:
    return " / ".join(f"{value / GIB:.1f}" for value in candidate.reserved)


def host_memory_fields(budget: MemoryBudget) -> dict:
    """The ``host_memory`` field of ``--json``: a node's host memory, the share pinned copies may take, in GiB."""
    return {
        "memory_gib": budget.host.memory_bytes / GIB,
        "pinned_fraction": budget.host.pinned_fraction,
        "pinned_limit_gib": budget.host.pinned_limit / GIB,
        "gpus_per_node": budget.gpus_per_node,
    }


def host_budget_text(budget: MemoryBudget) -> str:
    """A node's pinned share, as the tables say it."""
    host = budget.host
    return (
        f"{host.pinned_limit / GIB:.2f} GiB of pinned host memory per node of {budget.gpus_per_node} "
        f"GPU{'s' if budget.gpus_per_node > 1 else ''} ({host.pinned_fraction:.0%} of {host.memory_bytes / GIB:.2f} GiB)"
    )


def print_fit(result: FitResult, args: argparse.Namespace, budget: MemoryBudget) -> None:
    from schedlang.lowering.memory_budget import OUTSIDE_THE_ALLOCATOR, holds_no_process

    outside = f"{OUTSIDE_THE_ALLOCATOR / GIB:g} GiB"
    device = f"{budget.device_bytes / GIB:.1f} GiB " + (
        f"(not even the {outside} a process uses outside PyTorch's allocator: nothing can fit)"
        if holds_no_process(budget.device_bytes) else f"({outside} of it outside PyTorch's allocator)"
    )
    offloads = any(candidate.program.pipeline.offload for candidate in result.tried)
    host = f" and {host_budget_text(budget)}" if offloads else ""
    print(f"{args.file}: fitting one device of {device}{host}, lengths in steps of {args.step} tokens")
    profile = getattr(args, "hardware_profile", None)
    if profile is not None and result.tried:  # tokens/s come from its curves (commands.common.load_hardware_option)
        from schedlang.lowering.hardware_profile import model_parts

        print(profile.describe(model_parts(result.tried[0].program.model)))
    recompute_column = f"  {'recompute':>16}" if args.fit_recompute else ""
    host_column = f"  {'host GiB':>8}" if offloads else ""  # the fullest node's pinned host memory
    print(f"{'length':>9}  {'chunks':>6}  {'reserved GiB per stage':>24}  {'tokens/s':>12}{recompute_column}"
          f"{host_column}  fits")
    shown = {candidate.length for candidate in (result.proposal, result.refused) if candidate is not None}
    for candidate in (candidate for candidate in result.tried if candidate.length in shown):
        fits = "yes" if candidate.fits(budget) else "no"
        recompute = f"  {recompute_text(candidate.recompute):>16}" if args.fit_recompute else ""
        host = (f"  {max(budget.node_pinned_bytes(candidate.program, candidate.memory)) / GIB:>8.2f}"
                if offloads else "")
        print(
            f"{candidate.length:>9}  {candidate.n_chunks:>6}  {_peaks(candidate):>24}  "
            f"{candidate.tokens_per_second:>12,.0f}{recompute}{host}  {fits}"
        )
    if result.proposal is None:
        first = result.refused
        detail = f": at {first.length} tokens the smallest peak is {_peaks(first)} GiB" if first else ""
        print(f"nothing fits{detail}" + _host_binds(first, budget))
        return
    best = result.proposal
    print(
        f"longest: {best.length} tokens in {best.n_chunks} chunks, {best.tokens_per_second:,.0f} tokens/s predicted "
        f"(step {best.makespan:.4g} s), reserved peak {_peaks(best)} GiB per stage"
        + (f", recompute = {recompute_text(best.recompute)}" if args.fit_recompute else "")
    )
    for row in best.document_pieces or ():
        print(padding_line(row))
    if result.refused is None:
        print(f"(every length up to --max-length {args.max_length} fits)")
    else:
        refused = result.refused
        print(f"{refused.length} tokens does not fit: at best {_peaks(refused)} GiB ({refused.n_chunks} chunks)"
              + _host_binds(refused, budget))


def _host_binds(candidate: Candidate | None, budget: MemoryBudget) -> str:
    """Where the host memory binds ``candidate``, which its device peaks alone do not say (empty if it does not)."""
    from schedlang.lowering.memory_budget import MemoryPlace

    if candidate is None:
        return ""
    host = [misfit for misfit in candidate.misfits(budget) if misfit.place is MemoryPlace.HOST]
    return f"; the host binds: it {host[0].describe()}" if host else ""
