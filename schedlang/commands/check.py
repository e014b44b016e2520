"""``schedlang check FILE``: is the schedule legal, deadlock free and runnable?

Exit status 0 with a one-line summary when it is; 1 with every violation
(``file:line:col: error: ...`` pointing at the task token for explicit orders,
plus the cycle and step grid for a deadlock, or at the key that asks for what
the runtime cannot run, or at the data that cannot feed the model) when it is not. It runs the compiler's passes through
legality (:func:`schedlang.compiler.compile_schedule`), so a schedule it calls
legal is one ``compile`` generates.
"""

from __future__ import annotations

import argparse

from schedlang.commands.common import compile_legal

HELP = "check that a schedule runs every task once, respects Eq. 8, cannot deadlock and can run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")


def run(args: argparse.Namespace) -> int:
    from schedlang.compiler import Pass
    from schedlang.frontend import load_program, read_source
    from schedlang.preflight import check_data_file, check_tensorboard

    program = load_program(args.file)
    compilation = compile_legal(program, Pass.LEGALITY)
    if compilation is None:
        return 1
    check_data_file(program, read_source(args.file))
    check_tensorboard(program, read_source(args.file))
    print(f"{args.file}: {compilation.legality.summary()}")
    return 0
