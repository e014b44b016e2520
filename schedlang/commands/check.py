"""``schedlang check FILE``: is the schedule legal, deadlock free and runnable?

Exit status 0 with a one-line summary when it is; 1 with every violation
(``file:line:col: error: ...`` pointing at the task token for explicit orders,
plus the cycle and step grid for a deadlock, or at the key that asks for what
the runtime cannot run, or at the data that cannot feed the model) when it is not. It runs the compiler's passes through
legality (:func:`schedlang.compiler.compile_schedule`), so a schedule it calls
legal is one ``compile`` generates. A file with errors is still checked for legality and its data wherever
its errors do not feed them (schedlang.checks.partial), so one run reports every problem.
"""

from __future__ import annotations

import argparse
import sys

from schedlang.commands.common import compile_legal, print_legality_report

HELP = "check that a schedule runs every task once, respects Eq. 8, cannot deadlock and can run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")


def run(args: argparse.Namespace) -> int:
    from schedlang.compiler import Pass
    from schedlang.diagnostics import ScheduleError
    from schedlang.frontend import load_program, read_source
    from schedlang.preflight import check_data_file, check_tensorboard

    try:
        program = load_program(args.file)
    except ScheduleError as error:
        print(error.render(), file=sys.stderr)
        if error.partial is not None:
            check_partial_program(error.partial, read_source(args.file))
        return 1
    compilation = compile_legal(program, Pass.LEGALITY)
    data_errors = _schedule_errors(
        lambda: check_data_file(program, read_source(args.file)),
        lambda: check_tensorboard(program, read_source(args.file)),
    )
    for error in data_errors:
        print(error.render(), file=sys.stderr)
    if compilation is None or data_errors:
        return 1
    print(f"{args.file}: {compilation.legality.summary()}")
    return 0


def check_partial_program(partial, text: str) -> None:
    """The legality pass and the data preflight on what a file's errors leave known
    (schedlang.checks.partial), each report printed on standard error."""
    import dataclasses

    from schedlang.limits import check_program_limits
    from schedlang.lowering.legality import check_orders
    from schedlang.preflight import check_data_file

    program = dataclasses.replace(partial.program, source_text=text)
    if partial.orders_known:
        limit_errors = _schedule_errors(lambda: check_program_limits(program, text))
        for error in limit_errors:
            print(error.render(), file=sys.stderr)
        if not limit_errors:
            report = check_orders(program)
            if not report.is_legal:
                print_legality_report(program, report)
    if partial.data_known:
        for error in _schedule_errors(lambda: check_data_file(program, text)):
            print(error.render(), file=sys.stderr)


def _schedule_errors(*checks) -> list:
    """The ``ScheduleError`` each of ``checks`` raises, in order (none for a check that passes)."""
    from schedlang.diagnostics import ScheduleError

    errors = []
    for check in checks:
        try:
            check()
        except ScheduleError as error:
            errors.append(error)
    return errors
