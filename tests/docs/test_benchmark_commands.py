"""docs/benchmarks.md cannot drift from the code: every command it gives names schedule files that exist and that
``schedlang check`` accepts, every benchmark system it names is a revision the checker accepts, every claim
(a section with a table) has a command, and every log section it cites exists in docs/log.md. The other pages'
benchmark commands (``python3 benchmarks/...``) are held to the same checks.

A command is a line of an indented code block, or an inline code span of three words or more, that starts with
``schedlang`` or ``python3 benchmarks/``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from benchmarks.pipeline_schedule import (
    ONE_DEVICE_SCHEDULE,
    PIPELINE_SCHEDULE,
    BenchmarkSchedule,
    is_schedlang_system,
    system_program,
)
from schedlang.cli import build_parser
from schedlang.commands import check

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "benchmarks.md"
LOG = ROOT / "docs" / "log.md"
COMMAND_START = re.compile(r"^(?:schedlang|python3 benchmarks/)\S*")
DEFAULT_SCHEDULES = {"benchmarks/pipeline.py": PIPELINE_SCHEDULE, "benchmarks/one_device.py": ONE_DEVICE_SCHEDULE}
"""The schedule file each benchmark that takes ``--schedule`` revises when the command names none."""


def commands_of(text: str) -> list[str]:
    """The commands of Markdown ``text``: indented code lines and inline code spans (whitespace folded)."""
    lines = [line.strip() for line in text.splitlines() if line.startswith("    ")]
    found = [line for line in lines if COMMAND_START.match(line)]
    for span in re.findall(r"`([^`]+)`", text):
        folded = " ".join(span.split())
        if COMMAND_START.match(folded) and len(folded.split()) >= 3:  # `schedlang check` alone is prose
            found.append(folded)
    return found


def sections_of(text: str) -> dict[str, str]:
    """``## `` heading -> that section's text."""
    parts = re.split(r"(?m)^## ", text)
    return {part.splitlines()[0]: part for part in parts[1:]}


REFERENCE_TEXT = REFERENCE.read_text(encoding="utf-8")
COMMANDS = commands_of(REFERENCE_TEXT)
OTHER_DOCS = [path for path in sorted((ROOT / "docs").glob("*.md")) if path not in (REFERENCE, LOG)]
BENCHMARK_COMMANDS_ELSEWHERE = [  # the other pages' benchmark commands, held to the same checks
    command
    for path in [*OTHER_DOCS, ROOT / "README.md"]
    for command in commands_of(path.read_text(encoding="utf-8"))
    if command.startswith("python3 benchmarks/")
]


def test_the_parser_finds_code_lines_and_spans_only():
    text = "`schedlang check a.sched`\n\n    python3 benchmarks/x.py --y\n    not a command\n`schedlang check` is\n"
    assert commands_of(text) == ["python3 benchmarks/x.py --y", "schedlang check a.sched"]


def test_the_reference_gives_commands_and_schedule_files():
    assert len(COMMANDS) >= 10 and BENCHMARK_COMMANDS_ELSEWHERE
    assert sum(".sched" in command for command in COMMANDS) >= 3


@pytest.mark.parametrize("command", sorted(set(COMMANDS + BENCHMARK_COMMANDS_ELSEWHERE)))
def test_each_command_names_schedules_the_checker_accepts(command, capsys):
    words = shlex.split(command)
    schedules = [word for word in words if word.endswith(".sched")]
    for schedule in schedules:
        assert (ROOT / schedule).is_file(), f"{command}: no file {schedule}"
        assert check.run(build_parser().parse_args(["check", str(ROOT / schedule)])) == 0, capsys.readouterr()
    if words[0] == "schedlang":
        build_parser().parse_args(words[1:])  # the flags are the command line's (SystemExit otherwise)
        assert schedules, f"{command}: a schedlang command without a schedule file"
    script = words[1] if words[0] == "python3" else None
    assert script is None or (ROOT / script).is_file(), f"{command}: no script {script}"
    if script in DEFAULT_SCHEDULES:
        benchmark = BenchmarkSchedule(
            ROOT / _option(words, "--schedule", DEFAULT_SCHEDULES[script]),
            tiny="--tiny" in words,
            split_mlp="--split-mlp" in words,
            first_stage_layers=_integer(_option(words, "--first-stage-layers", None)),
        )
        systems = [word for word in words if is_schedlang_system(word)]
        for name in systems:  # a name the checker refuses raises ScheduleError or ValueError here
            system_program(benchmark, name, _integer(_option(words, "--length", None)))


def _option(words: list[str], flag: str, default):
    return words[words.index(flag) + 1] if flag in words else default


def _integer(value) -> int | None:
    return None if value is None else int(value)


@pytest.mark.parametrize("title", [title for title, text in sections_of(REFERENCE_TEXT).items() if "\n| " in text])
def test_each_claim_has_a_command(title):
    section = sections_of(REFERENCE_TEXT)[title]
    assert commands_of(section) or "no checked-in command" in section, f"{title!r} gives no command"


def test_each_cited_log_section_exists():
    log = LOG.read_text(encoding="utf-8")
    dated = {date: sections_of(text) for date, text in re.findall(r"(?ms)^# (\d{4}-\d\d-\d\d)\n(.*?)(?=^# |\Z)", log)}
    folded = " ".join(REFERENCE_TEXT.split())
    citations = re.findall(r"(\d{4}-\d\d-\d\d), \"([^\"]+)\"", folded)
    assert len(citations) >= 8
    for date, title in citations:
        assert any(heading.startswith(title) for heading in dated.get(date, {})), f"log has no {date} {title!r}"
    headings = [heading for sections in dated.values() for heading in sections]
    rows = [line for line in sections_of(REFERENCE_TEXT)["Other measurements"].splitlines() if line.startswith("| ")]
    assert len(rows) >= 3
    for row in rows[2:]:  # after the header and its rule
        (title,) = re.findall(r"\| \"([^\"]+)\" \|$", row)
        assert any(heading.startswith(title) for heading in headings), f"log has no {title!r}"
