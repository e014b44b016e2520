"""``schedlang export FILE --format torch-csv -o OUT``: the order in another tool's format.

``torch-csv`` writes the CSV that torch.distributed.pipelining's
``_PipelineScheduleRuntime._load_csv`` reads: one row per rank, one column
per lockstep step, cells like ``0F1``, an empty cell where the rank waits;
with ``pipeline { split_backward = true }`` a backward is written as torch's
``I`` (input gradients) and its weight gradients as ``W``. torch's actions have
no field for a sequence chunk, so chunk ``i`` of microbatch ``a`` is written as
torch microbatch ``a * chunks + i``, the state order kept by the order of each
row ([Note: chunks as torch microbatches] in schedlang.lowering.export.torch_csv);
``schedlang import --chunks`` reads it back. ``-o -`` writes to standard output.
"""

from __future__ import annotations

import argparse
from enum import Enum

from schedlang.commands.common import compile_legal, write_output

HELP = "export the pipeline order as torch.distributed.pipelining's CSV (each microbatch chunk a torch microbatch)"


class ExportFormat(str, Enum):
    TORCH_CSV = "torch-csv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument("--format", required=True, choices=[member.value for member in ExportFormat])
    parser.add_argument("-o", "--output", required=True, help="output file; '-' for standard output")


def run(args: argparse.Namespace) -> int:
    from schedlang.compiler import Pass
    from schedlang.frontend import load_program
    from schedlang.lowering.export.torch_csv import torch_csv_text

    compilation = compile_legal(load_program(args.file), Pass.LEGALITY)
    if compilation is None:
        return 1
    program = compilation.program
    write_output(args.output, torch_csv_text(compilation.orders, program.n_chunks))
    if args.output != "-" and program.n_chunks > 1:
        print(
            f"wrote {args.output}: chunk i of microbatch a is torch microbatch a * {program.n_chunks} + i "
            f"({program.n_microbatches * program.n_chunks} torch microbatches); "
            f"`schedlang import {args.output} --chunks {program.n_chunks}` reads it back"
        )
    return 0
