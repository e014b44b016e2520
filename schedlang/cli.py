"""The ``schedlang`` command line: one subcommand per module in ``schedlang.commands``.

Each command module (``export-model`` is ``export_model``) exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status). Errors in the user's schedule arrive as
:class:`schedlang.diagnostics.ScheduleError` and are printed as
``file:line:col: error: ...`` with the source line and a caret; they never
surface as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_NAMES = ("check", "simulate", "tune", "viz", "export", "import", "compile", "run", "export-model", "profile")
COMMAND_MODULES = {"import": "import_csv"}
"""Commands whose module is not named after them (``import`` is a Python keyword)."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("schedlang")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    from schedlang.outputs import add_force_argument

    parser = argparse.ArgumentParser(
        prog="schedlang",
        description="Compile, check, simulate and visualize pipeline schedules for linear-recurrence models.",
    )
    parser.add_argument("--version", action="version", version=f"schedlang {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_NAMES:
        module = importlib.import_module(f"schedlang.commands.{COMMAND_MODULES.get(name, name.replace('-', '_'))}")
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        add_force_argument(sub, name)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from schedlang.diagnostics import ScheduleError
    from schedlang.outputs import end_quietly_on_broken_pipe, refuse_outputs_over_inputs, refuse_unsafe_outputs

    args = build_parser().parse_args(argv)
    try:
        refuse_outputs_over_inputs(args)
        refuse_unsafe_outputs(args)
        return args.handler(args)
    except ScheduleError as error:
        print(error.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return end_quietly_on_broken_pipe()
    except KeyboardInterrupt:  # Ctrl-C before a run's job starts (then schedlang.launch handles it): no traceback
        print("schedlang: interrupted", file=sys.stderr)
        return 130
    except OSError as error:
        print(f"schedlang: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
