"""Where commands write, and what they refuse to write over.

Rules, checked before any work is done:

- ``-`` as an output means standard output, for every command that writes a file.
- No output may be one of the command's inputs (the schedule file): ``compile X.sched -o X.sched``,
  ``run X.sched --metrics X.sched`` and the like are refused, whatever path spelling names the file.
- ``compile`` without ``-o`` writes ``train.py`` only when there is none yet, or with ``--force``.
- An output never names a file schedlang did not write, unless ``--force``: an existing file is replaced
  only when its first bytes are those of the output schedlang writes there (:data:`OUTPUT_KINDS`); a
  symbolic link is replaced (never written through) only with ``--force``; a FIFO, device, socket or
  directory is refused whatever the flags ([Note: file safety] in schedlang.vocabulary.files).
- ``tune -o`` and ``profile -o`` replace nothing already there without ``--force`` (:func:`whole_file_problem`).
- An output whose folder does not exist is refused; no folder is made (:func:`missing_folder`).
- Files are written to a temporary file in the target's directory and renamed over it.
- JSON output is strict JSON: a value that is not finite (an infinite makespan on a link of 1e-320 B/s)
  is written as ``null``, never as ``NaN`` or ``Infinity``; so are ``run``'s metrics.
- A reader that stops early (``schedlang ... | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from enum import Enum
from pathlib import Path

from schedlang.vocabulary.files import file_kind, finite_or_none, write_replacing

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


def strict_json(value, indent: int | None = 2) -> str:
    """``json.dumps`` with every non-finite float written as ``null``."""
    return json.dumps(finite_or_none(value), indent=indent, allow_nan=False)


def end_quietly_on_broken_pipe() -> int:
    """After ``BrokenPipeError``: point standard output at /dev/null so the interpreter's final flush is
    silent, and return the status a shell gives a command a pipe closed on (128 + SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


class OutputKind(str, Enum):
    """What a command writes at an output path; each kind has the first bytes schedlang's own file starts with."""

    SCRIPT = "training script"
    METRICS = "metrics file"
    DOT = "DOT graph"
    CHROME = "Chrome trace"
    PNG = "PNG chart"
    CSV = "pipeline CSV"
    IMPORTED = "schedule file"  # `schedlang import`'s


SIGNATURE_BYTES = 4096
_CSV_CELL = re.compile(rb"(\d+[FBIW]\d+)?")


def _looks_like_metrics(head: bytes) -> bool:
    first_line = head.split(b"\n", 1)[0].strip()
    if not first_line:
        return not head.strip()
    try:
        record = json.loads(first_line)
    except ValueError:
        return False
    return isinstance(record, dict) and "step" in record and "loss" in record


OUTPUT_SIGNATURES = {
    OutputKind.SCRIPT: lambda head: head.startswith(b'"""Train schedule '),
    OutputKind.METRICS: _looks_like_metrics,
    OutputKind.DOT: lambda head: head.startswith(b'digraph "'),
    OutputKind.CHROME: lambda head: head.startswith(b"{") and b'"microseconds_per_time_unit"' in head,
    OutputKind.PNG: lambda head: head.startswith(b"\x89PNG") and b"Software\x00schedlang" in head,
    OutputKind.CSV: lambda head: bool(head.strip())
    and all(_CSV_CELL.fullmatch(cell) for cell in head.split(b"\n", 1)[0].split(b",")),
    OutputKind.IMPORTED: lambda head: head.startswith(b"# Imported by `schedlang import` from "),
}

# (command, option attribute) -> the kind written there; viz's kind follows its --format
OUTPUT_KINDS = {
    ("compile", "output"): OutputKind.SCRIPT,
    ("run", "metrics"): OutputKind.METRICS,
    ("run", "keep_script"): OutputKind.SCRIPT,
    ("export", "output"): OutputKind.CSV,
    ("import", "output"): OutputKind.IMPORTED,
    ("viz", "output"): None,
}
VIZ_OUTPUT_KINDS = {"dot": OutputKind.DOT, "chrome": OutputKind.CHROME, "png": OutputKind.PNG}
FORCE_COMMANDS = ("compile", "run", "viz", "export", "import")


def add_force_argument(parser: argparse.ArgumentParser, command: str) -> None:
    """``--force`` for every command that writes files, where the command does not define its own."""
    if command in FORCE_COMMANDS and "--force" not in parser._option_string_actions:
        parser.add_argument(
            "--force", action="store_true",
            help="replace an existing output file schedlang did not write (or a symbolic link there)",
        )


def written_by_schedlang(path: str | os.PathLike, kind: OutputKind) -> bool:
    """Whether the regular file ``path`` starts as the ``kind`` of file schedlang writes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(SIGNATURE_BYTES)
    except OSError:
        return False
    return OUTPUT_SIGNATURES[kind](head)


def output_problem(path: str, kind: OutputKind, force: bool) -> str | None:
    """Why ``path`` may not receive this output: a special file (always), or, without ``force``, a symbolic link
    or an existing file schedlang did not write. None when it may."""
    if path == STANDARD_OUTPUT:
        return None
    info, problem = examined_output(path)
    if info is None:
        return problem
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.stat(path)
        except OSError:
            target = None
        if target is not None and not stat.S_ISREG(target.st_mode):
            return f"{path} is a link to {file_kind(target.st_mode)}, not a regular file"
        if not force:
            return f"{path} is a symbolic link; give --force to replace the link (its target is never written)"
        return None
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is {file_kind(info.st_mode)}, not a regular file"
    if not force and not written_by_schedlang(path, kind):
        return (
            f"{path} exists and is not a {kind.value} schedlang wrote; "
            "give another path, or --force to replace it"
        )
    return None


def examined_output(path: str) -> tuple[os.stat_result | None, str | None]:
    """What is at ``path`` now (``os.lstat``: a link itself), or None and why no file can be made there (None
    too when one can: nothing is there and its folder exists)."""
    try:
        return os.lstat(path), None
    except FileNotFoundError:
        return None, missing_folder(path)
    except OSError as error:
        return None, f"{path} cannot be examined: {error.strerror or error}"


def missing_folder(path: str) -> str | None:
    """Why no file can be made at ``path``: its folder does not exist, or is not a folder. None when it can."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(folder):
        return None
    what = "is not a folder" if os.path.lexists(folder) else "does not exist"
    return f"{path} cannot be written: its folder {folder} {what}"


def whole_file_problem(path: str, force: bool) -> str | None:
    """Why a command that writes a file of its own making (``tune -o``, ``profile -o``) may not write ``path``:
    a missing folder or a special file always; without ``force``, anything already there, a link included (the
    file is then written in place of the link, never through it). None when it may."""
    if path == STANDARD_OUTPUT:
        return None
    info, problem = examined_output(path)
    if info is None:
        return problem
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        return f"{path} is {file_kind(info.st_mode)}, not a regular file"
    if not force:
        return f"{path} already exists; give --force to replace it, or another -o"
    return None


def refuse_unsafe_outputs(args: argparse.Namespace) -> None:
    """Exit with one line when an output option of ``args`` names a path :func:`output_problem` refuses."""
    for (command, name), kind in OUTPUT_KINDS.items():
        if command != args.command or not getattr(args, name, None):
            continue
        if kind is None:  # viz: --format, or the format -o's suffix implies
            from schedlang.commands.viz import output_format_of

            kind = VIZ_OUTPUT_KINDS[output_format_of(args).value]
        problem = output_problem(getattr(args, name), kind, getattr(args, "force", False))
        if problem:
            raise SystemExit(f"schedlang {args.command}: error: {problem}")


def write_output_file(path: str | os.PathLike, content: str | bytes) -> None:
    """Write an output through a temporary file renamed over ``path`` ([Note: file safety])."""
    write_replacing(path, content)


METRICS_LINE_BYTES = 1 << 16  # a metrics record is a few hundred bytes


def first_and_last_metrics(path: Path) -> tuple[dict, dict] | None:
    """The first and last records of a metrics file, reading at most two lines' worth of bytes from its ends;
    None when it is missing, empty or not a regular file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return None
        head = handle.read(METRICS_LINE_BYTES)
        handle.seek(max(0, info.st_size - METRICS_LINE_BYTES))
        tail = handle.read(METRICS_LINE_BYTES)
    lines = [line for line in head.split(b"\n") if line.strip()]
    last_lines = [line for line in tail.split(b"\n") if line.strip()]
    if not lines or not last_lines:
        return None
    try:
        return json.loads(lines[0]), json.loads(last_lines[-1])
    except ValueError:
        return None


