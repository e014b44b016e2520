"""Loading a schedule: read the file, then parse and check it (the first two passes of
:func:`schedlang.compiler.compile_schedule`).

:func:`load_program` returns a :class:`~schedlang.lowering.program.ScheduleProgram`
or raises :class:`~schedlang.diagnostics.ScheduleError` listing every problem
found in the file (or ``OSError`` when the file cannot be opened).
"""

from __future__ import annotations

from pathlib import Path

from schedlang.diagnostics import Diagnostic, ScheduleError
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import Span
from schedlang.vocabulary.files import UnsafeFileError, read_bounded
from schedlang.vocabulary.source_lines import normalize_source_text

MAX_SCHEDULE_BYTES = 64 << 20  # an explicit order at the task limit is about 10 MB


def read_source(path: str | Path) -> str:
    """The text of a schedule file.

    Raises ``OSError`` with a message naming the file when it is missing or
    unreadable, a FIFO, device or socket, or longer than ``MAX_SCHEDULE_BYTES``
    (read bounded: [Note: file safety] in schedlang.vocabulary.files), and
    :class:`ScheduleError` pointing at the first byte that is not UTF-8.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"'{path}' is a directory, not a schedule file")
    try:
        data = read_bounded(path, MAX_SCHEDULE_BYTES, "schedule file")
    except UnsafeFileError as error:
        raise OSError(str(error)) from None
    except FileNotFoundError:
        raise FileNotFoundError(f"schedule file '{path}' does not exist") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"'{path}' is a directory, not a schedule file") from None
    except OSError as error:
        raise OSError(f"cannot read schedule file '{path}': {error.strerror or error}") from None
    try:
        return normalize_source_text(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        readable = data[: error.start].decode("utf-8")
        line = readable.count("\n") + 1
        column = len(readable) - (readable.rfind("\n") + 1) + 1
        span = Span(str(path), line, column, line, column + 1)
        diagnostic = Diagnostic.error(
            f"byte 0x{data[error.start]:02x} is not valid UTF-8", span, hint="save the file as UTF-8"
        )
        raise ScheduleError([diagnostic], {str(path): readable + "\n"}) from None


def load_program_text(text: str, filename: str = "<memory>") -> ScheduleProgram:
    """Parse and check schedule text given in memory."""
    from schedlang.compiler import Pass, ScheduleText, compile_schedule

    return compile_schedule(ScheduleText(text, filename), through=Pass.CHECK).program


def load_program(path: str | Path) -> ScheduleProgram:
    """Read, parse and check a schedule file."""
    return load_program_text(read_source(path), str(path))
