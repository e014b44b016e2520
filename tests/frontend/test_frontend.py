"""Loading files: missing files, bad encodings, and the rendered report."""

from __future__ import annotations

import pytest

from schedlang.diagnostics import Diagnostic, ScheduleError, format_diagnostic
from schedlang.frontend import load_program, read_source
from schedlang.vocabulary import Span

from .helpers import VALID, replace_line


def test_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="schedule file '.*nothing.sched' does not exist"):
        read_source(tmp_path / "nothing.sched")


def test_directory_is_not_a_schedule(tmp_path):
    with pytest.raises(OSError, match="is a directory"):
        read_source(tmp_path)


def test_invalid_utf8_points_at_the_byte(tmp_path):
    path = tmp_path / "bad.sched"
    path.write_bytes(b"schedule t\nmodel {\n  vocab = 2\xff56\n}\n")
    with pytest.raises(ScheduleError) as raised:
        read_source(path)
    (diagnostic,) = raised.value.diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (3, 12)
    assert diagnostic.message == "byte 0xff is not valid UTF-8"


def test_load_program_reports_every_error_with_the_file_name(tmp_path):
    path = tmp_path / "two.sched"
    path.write_text(replace_line(replace_line(VALID, 6, "  heads = 0"), 19, "  order = zigzag"))
    with pytest.raises(ScheduleError) as raised:
        load_program(path)
    rendered = raised.value.render()
    assert rendered.startswith(
        f"{path}:6:11: error: 'model.heads' must be >= 1, found 0\n  heads = 0\n          ^\n"
    )
    assert f"{path}:19:11: error: unknown pipeline order 'zigzag'" in rendered
    assert rendered.endswith("2 errors")


def test_format_diagnostic_without_source_and_multiline_span():
    diagnostic = Diagnostic.error("bad", Span("f.sched", 2, 3, 4, 1), hint="fix it")
    assert format_diagnostic(diagnostic, None) == "f.sched:2:3: error: bad\n  hint: fix it"
    assert format_diagnostic(diagnostic, "one\n  two words\nthree\n") == (
        "f.sched:2:3: error: bad\n  two words\n  ^~~~~~~~~\n  hint: fix it"
    )
