"""Where commands write, and what they refuse to write over.

Rules, checked before any work is done:

- ``-`` as an output means standard output, for every command that writes a file.
- No output may be one of the command's inputs (the schedule file): ``compile X.sched -o X.sched``,
  ``run X.sched --metrics X.sched`` and the like are refused, whatever path spelling names the file.
- ``compile`` without ``-o`` writes ``train.py`` only when there is none yet, or with ``--force``.
- JSON output is strict JSON: a value that is not finite (an infinite makespan on a link of 1e-320 B/s)
  is written as ``null``, never as ``NaN`` or ``Infinity``.
- A reader that stops early (``schedlang ... | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

STANDARD_OUTPUT = "-"
DEFAULT_SCRIPT = "train.py"
OUTPUT_OPTIONS = (("output", "-o"), ("metrics", "--metrics"), ("keep_script", "--keep-script"))
INPUT_OPTIONS = ("file",)


def _same_file(first: str, second: str) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return os.path.abspath(first) == os.path.abspath(second)


def refuse_outputs_over_inputs(args: argparse.Namespace) -> None:
    """Exit with one line when an output option of ``args`` names one of its input files."""
    inputs = [getattr(args, name) for name in INPUT_OPTIONS if getattr(args, name, None)]
    for name, flag in OUTPUT_OPTIONS:
        output = getattr(args, name, None)
        if not output or output == STANDARD_OUTPUT:
            continue
        for path in inputs:
            if _same_file(output, path):
                raise SystemExit(
                    f"schedlang {args.command}: error: {flag} {output} is the input schedule {path}; "
                    "refusing to write over it"
                )


def compile_output(args: argparse.Namespace) -> str:
    """The path ``compile`` writes (or ``-``); refuses to replace a ``train.py`` it was not told to write."""
    if args.output is not None:
        return args.output
    if Path(DEFAULT_SCRIPT).exists() and not args.force:
        raise SystemExit(
            f"schedlang compile: error: {DEFAULT_SCRIPT} already exists; "
            "give -o FILE to write elsewhere, or --force to replace it"
        )
    return DEFAULT_SCRIPT


def launch_hint(schedule_path: str, script: str) -> str:
    """``torchrun --nproc-per-node N SCRIPT`` with the schedule's own rank count."""
    import shlex

    from schedlang.frontend import load_program

    world_size = load_program(schedule_path).mesh.world_size
    return f"torchrun --nproc-per-node {world_size} {shlex.quote(script)}"


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def strict_json(value, indent: int | None = 2) -> str:
    """``json.dumps`` with every non-finite float written as ``null``."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False)


def end_quietly_on_broken_pipe() -> int:
    """After ``BrokenPipeError``: point standard output at /dev/null so the interpreter's final flush is
    silent, and return the status a shell gives a command a pipe closed on (128 + SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141
