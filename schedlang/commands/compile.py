"""``schedlang compile FILE -o train.py``: generate the training script of a schedule.

The schedule is loaded and checked; an illegal one is refused with the
legality report (exit 1), as is one asking for what the runtime cannot run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "generate a torch.distributed training script (run it with torchrun) from a schedule"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")
    parser.add_argument(
        "-o", "--output", default=None,
        help="where to write the script; '-' for standard output (default: train.py, if there is none yet)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing train.py when -o is not given")


def generate_script(schedule_path: str, script_name: str = "train.py") -> str:
    """Load, check and render; raises ``ScheduleError`` for every user-facing problem."""
    from schedlang.diagnostics import Diagnostic, ScheduleError
    from schedlang.frontend import load_program, read_source
    from schedlang.lowering import paths
    from schedlang.lowering.codegen import UnsupportedScheduleError, render_train_script
    from schedlang.lowering.legality import IllegalScheduleError, render_report
    from schedlang.lowering.source import Span

    program = paths.with_resolved_paths(load_program(schedule_path))
    try:
        return render_train_script(program, script_name)
    except IllegalScheduleError as error:
        text = read_source(schedule_path)
        raise IllegalScheduleReport(
            render_report(error.report, {str(schedule_path): text, program.source_file: text})
        ) from None
    except UnsupportedScheduleError as error:
        span = error.span or Span(str(schedule_path), 1, 1, 1, 1)
        raise ScheduleError([Diagnostic.error(error.message, span)], {span.file: read_source(schedule_path)}) from None


class IllegalScheduleReport(Exception):
    """The rendered legality report of a schedule that must not be compiled."""


def run(args: argparse.Namespace) -> int:
    from schedlang.outputs import STANDARD_OUTPUT, compile_output, launch_hint

    output = Path(compile_output(args))
    try:
        script = generate_script(args.file, output.name)
    except IllegalScheduleReport as report:
        print(str(report), file=sys.stderr)
        print(f"schedlang: error: {args.file} is not a legal schedule; nothing was generated", file=sys.stderr)
        return 1
    if str(output) == STANDARD_OUTPUT:
        sys.stdout.write(script)
        return 0
    output.write_text(script, encoding="utf-8")
    print(f"wrote {output} (run it with: {launch_hint(args.file, str(output))})")
    return 0
