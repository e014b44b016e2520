"""``schedlang compile FILE -o train.py``: generate the training script of a schedule.

Runs every pass of :func:`schedlang.compiler.compile_schedule`; an illegal
schedule is refused with the legality report (exit 1), and one asking for
what the runtime cannot run with the checker's errors at the keys that ask.
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
    """Every pass through codegen; raises ``ScheduleError`` for a schedule the checker refuses and
    :class:`IllegalScheduleReport` for illegal orders."""
    from schedlang.frontend import load_program
    from schedlang.lowering import paths

    return script_of_program(paths.with_resolved_paths(load_program(schedule_path)), script_name)


def script_of_program(program, script_name: str = "train.py") -> str:
    """The training script of a checked ``program`` whose paths are resolved; raises
    :class:`IllegalScheduleReport` for illegal orders."""
    from schedlang.compiler import compile_schedule
    from schedlang.lowering.legality import IllegalScheduleError, render_report

    try:
        return compile_schedule(program, script_name=script_name).script
    except IllegalScheduleError as error:
        raise IllegalScheduleReport(render_report(error.report, {program.source_file: program.source_text})) from None


class IllegalScheduleReport(Exception):
    """The rendered legality report of a schedule that must not be compiled."""


def run(args: argparse.Namespace) -> int:
    from schedlang.outputs import DEFAULT_SCRIPT, STANDARD_OUTPUT, compile_output, launch_hint, write_output_file

    output = Path(compile_output(args))
    # A script printed to standard output is saved under a name the user picks; its docstring names the default.
    script_name = DEFAULT_SCRIPT if str(output) == STANDARD_OUTPUT else output.name
    try:
        script = generate_script(args.file, script_name)
    except IllegalScheduleReport as report:
        print(str(report), file=sys.stderr)
        print(f"schedlang: error: {args.file} is not a legal schedule; nothing was generated", file=sys.stderr)
        return 1
    if str(output) == STANDARD_OUTPUT:
        sys.stdout.write(script)
        return 0
    write_output_file(output, script)
    print(f"wrote {output} (run it with: {launch_hint(args.file, str(output))})")
    return 0
