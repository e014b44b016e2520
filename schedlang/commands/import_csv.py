"""``schedlang import FILE.csv -o OUT.sched``: a torch.distributed.pipelining schedule CSV as a schedule.

Reads the CSV torch's ``_PipelineScheduleRuntime._load_csv`` reads (one row per rank, cells like ``0F1``,
``I``/``W`` for a split backward; torch's end-of-step ``REDUCE_GRAD`` and FSDP actions are dropped, since
schedlang reduces gradients itself) and writes a schedule with ``order = explicit`` holding each rank's
compute actions in their order, which ``schedlang check`` verifies. Only schedules with one stage per rank
can be said in the language (GPipe, 1F1B, ZB with I/W; an interleaved or V schedule is refused at its first
cell on another rank's stage).

``--chunks N`` reads torch microbatch ``m`` as chunk ``m % N`` of microbatch ``m // N`` ([Note: chunks as
torch microbatches] in schedlang.lowering.export.torch_csv), the inverse of ``schedlang export``.
``--like SCHED`` takes the model, mesh, sequence and train blocks, and the pipeline keys that are not the
order's, from an existing schedule (and its chunk count when ``--chunks`` is not given); without it a
small model of one GLA layer per stage stands in, on synthetic data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schedlang.commands.common import write_output

HELP = "read torch.distributed.pipelining's schedule CSV into a schedule with an explicit order"

ORDER_KEYS = (
    "microbatches", "order", "extra_warmup", "split_backward", "forward_before_weight", "extra_deferred_weights"
)
"""The pipeline keys the imported order replaces; the block's other keys are kept from ``--like``."""

STAND_IN_BLOCKS = """model {{
  vocab    = 256
  d_model  = 64
  layers   = [gla] * {n_stages}
  heads    = 1
  head_dim = 64
}}

mesh {{
  pipeline = {n_stages}
}}

sequence {{
  length       = {length}
  chunks       = {n_chunks}
  kernel_chunk = 64
}}

train {{
  steps     = 1
  optimizer = adamw(lr = 1e-3)
  data      = synthetic(seed = 1)
}}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="torch schedule CSV (one row per rank)")
    parser.add_argument("-o", "--output", required=True, help="schedule file to write; '-' for standard output")
    parser.add_argument("--chunks", type=int, default=None, help="read each N torch microbatches as N chunks of one")
    parser.add_argument("--like", default=None, help="take every block but the pipeline order from this schedule")
    parser.add_argument("--name", default=None, help="the schedule's name (default: the CSV file's stem)")


def pipeline_block(orders, n_chunks: int, kept_keys: tuple[str, ...] = ()) -> str:
    """The ``pipeline`` block of ``orders``: microbatches, ``order = explicit``, ``split_backward`` when the
    orders hold ``W`` tasks, ``kept_keys`` (``key = value`` as written) and one ``stage r:`` line per stage."""
    from schedlang.lowering.export.torch_csv import splits_backward

    n_microbatches = 1 + max((task.microbatch for order in orders for task in order), default=0)
    lines = ["pipeline {", f"  microbatches = {n_microbatches}", "  order        = explicit"]
    if splits_backward(orders):
        lines.append("  split_backward = true")
    lines.extend(f"  {key}" for key in kept_keys)
    for stage, order in enumerate(orders):  # the language takes one line per stage, however long
        lines.append(f"  stage {stage}: " + " ".join(task.local_form() for task in order))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _span_text(text: str, span) -> str:
    start, end = span.offsets(text)
    return text[start:end]


def schedule_like(like_path: str, orders, n_chunks: int) -> str:
    """``like_path``'s text with its pipeline block replaced by the imported order's (its keys that do not
    make the order kept)."""
    from schedlang import ast
    from schedlang.frontend import read_source
    from schedlang.parser import parse_text

    text = read_source(like_path)
    schedule = parse_text(text, like_path)
    pipeline = next((block for block in schedule.blocks if block.name == "pipeline"), None)
    kept = ()
    if pipeline is not None:
        kept = tuple(
            _span_text(text, item.span)
            for item in pipeline.items
            if isinstance(item, ast.Assignment) and item.key not in ORDER_KEYS
        )
    block = pipeline_block(orders, n_chunks, kept)
    if pipeline is None:
        return text.rstrip("\n") + "\n\n" + block
    start, end = pipeline.span.offsets(text)
    return text[:start] + block.rstrip("\n") + text[end:]


def schedule_name(text: str) -> str:
    """``text`` as a schedule name: other characters than letters, digits and ``_`` become ``_``, and a name
    that would start with a digit gets ``schedule_`` before it (``1F1B`` -> ``schedule_1F1B``)."""
    name = "".join(character if character.isalnum() or character == "_" else "_" for character in text)
    return f"schedule_{name}" if not name or name[0].isdigit() else name


def run(args: argparse.Namespace) -> int:
    from schedlang.frontend import load_program
    from schedlang.lowering.export.torch_csv import TorchCsvError, load_torch_csv

    if args.chunks is not None and args.chunks < 1:
        raise SystemExit(f"schedlang import: error: --chunks must be at least 1, got {args.chunks}")
    n_chunks = args.chunks
    if n_chunks is None:
        n_chunks = load_program(args.like).n_chunks if args.like else 1
    try:
        orders = load_torch_csv(args.file, n_chunks)
    except TorchCsvError as error:
        print(f"schedlang import: {error}", file=sys.stderr)
        return 1
    torch_microbatches = 1 + max((task.microbatch * n_chunks + task.chunk for order in orders for task in order),
                                 default=0)
    if torch_microbatches % n_chunks:
        print(
            f"schedlang import: error: {args.file} has {torch_microbatches} torch microbatches, not a whole number "
            f"of microbatches of {n_chunks} chunks; give the --chunks the file was exported with",
            file=sys.stderr,
        )
        return 1
    name = schedule_name(args.name or Path(args.file).stem)
    comment = (
        f"# Imported by `schedlang import` from {Path(args.file).name}: torch microbatch m is chunk m % {n_chunks} "
        f"of microbatch m // {n_chunks}.\n"
    )
    if args.like:
        text = comment + schedule_like(args.like, orders, n_chunks)
    else:
        blocks = STAND_IN_BLOCKS.format(n_stages=len(orders), n_chunks=n_chunks, length=64 * n_chunks)
        text = f"{comment}schedule {name}\n\n{blocks}\n{pipeline_block(orders, n_chunks)}"
    write_output(args.output, text)
    if args.output != "-":
        stages = len(orders)
        print(f"wrote {args.output} ({stages} stages, order = explicit); `schedlang check {args.output}` checks it")
    return 0
