"""``schedlang check FILE``: is the schedule legal and deadlock free?

Exit status 0 with a one-line summary when it is; 1 with every violation
(``file:line:col: error: ...`` pointing at the task token for explicit orders,
plus the cycle and step grid for a deadlock) when it is not.
"""

from __future__ import annotations

import argparse

from schedlang.commands.common import print_legality_report

HELP = "check that a schedule runs every task once, respects Eq. 8 and cannot deadlock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="schedule file (.sched)")


def run(args: argparse.Namespace) -> int:
    from schedlang.frontend import load_program
    from schedlang.lowering.legality import check_orders

    program = load_program(args.file)
    report = check_orders(program)
    if report.is_legal:
        print(f"{args.file}: {report.summary()}")
        return 0
    print_legality_report(args.file, program, report)
    return 1
