"""``schedlang export FILE --format torch-csv -o OUT``: the order in another tool's format.

``torch-csv`` writes the CSV that torch.distributed.pipelining's
``_PipelineScheduleRuntime._load_csv`` reads: one row per rank, one column
per lockstep step, cells like ``0F1``, an empty cell where the rank waits;
with ``pipeline { split_backward = true }`` a backward is written as torch's
``I`` (input gradients) and its weight gradients as ``W``. Only schedules
with one chunk per microbatch can be written, since torch's actions have no
notion of sequence chunks; a chunked schedule is an error that points at its
``chunks`` key. ``-o -`` writes to standard output.
"""

from __future__ import annotations

import argparse
from enum import Enum

from schedlang.commands.common import compile_legal, write_output

HELP = "export the pipeline order, e.g. as the CSV torch.distributed.pipelining loads (one chunk per microbatch)"


class ExportFormat(str, Enum):
    TORCH_CSV = "torch-csv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument("--format", required=True, choices=[member.value for member in ExportFormat])
    parser.add_argument("-o", "--output", required=True, help="output file; '-' for standard output")


def run(args: argparse.Namespace) -> int:
    from schedlang.compiler import Pass
    from schedlang.diagnostics import Diagnostic, ScheduleError
    from schedlang.frontend import load_program
    from schedlang.lowering.export.torch_csv import ChunkedScheduleError, torch_csv_text

    compilation = compile_legal(load_program(args.file), Pass.LEGALITY)
    if compilation is None:
        return 1
    program = compilation.program
    try:
        text = torch_csv_text(compilation.orders, program.n_chunks)
    except ChunkedScheduleError as error:
        span = program.spans.get("sequence.chunks") or program.spans.get("sequence")
        if span is None:
            raise SystemExit(f"{args.file}: error: {error}") from None
        raise ScheduleError([Diagnostic.error(str(error), span)], {program.source_file: program.source_text}) from None
    write_output(args.output, text)
    return 0
