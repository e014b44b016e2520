"""Fuzzing the front end: whatever the input, the only failure is a positioned ScheduleError.

Inputs are the examples mutated token by token (deleted, duplicated, swapped,
replaced by another token of the language), truncated, or sprinkled with random
characters and bytes, plus free text from hypothesis. Every input must either
lower to a program or raise ScheduleError whose diagnostics point inside the
text and render; any other exception fails the test.
"""

from __future__ import annotations

import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text, read_source
from schedlang.lowering.program import ScheduleProgram

from .helpers import EXAMPLES

EXAMPLE_TEXTS = [path.read_text() for path in sorted(EXAMPLES.glob("*.sched"))]
_TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*\.[0-9]+|[A-Za-z0-9_.+-]+|\"[^\"\n]*\"|.", re.S)
VOCABULARY = sorted(
    {token for text in EXAMPLE_TEXTS for token in _TOKEN.findall(text) if not token.isspace()}
    | {
        "{",
        "}",
        "[",
        "]",
        "(",
        ")",
        "=",
        ",",
        "*",
        ":",
        "every",
        "stage",
        "#",
        "//",
        '"',
        "\\",
        "1e999",
        "-0",
        "F",
        "B0.",
    }
)


def assert_only_schedule_errors(text: str, filename: str = "fuzz.sched") -> bool:
    """True when ``text`` lowered to a program, False when it raised a well-formed ScheduleError."""
    try:
        program = load_program_text(text, filename)
    except ScheduleError as error:
        assert error.diagnostics
        n_lines = text.count("\n") + 1
        for diagnostic in error.diagnostics:
            span = diagnostic.span
            assert span.file == filename
            assert 1 <= span.line <= n_lines, (span, text)
            assert span.column >= 1, (span, text)
            assert (span.end_line, span.end_column) >= (span.line, span.column), span
        rendered = error.render()
        assert f"{filename}:{error.diagnostics[0].span.line}:" in rendered
        return False
    assert isinstance(program, ScheduleProgram)
    return True


def mutate(text: str, generator: random.Random) -> str:
    tokens = _TOKEN.findall(text)
    for _ in range(generator.randint(1, 4)):
        operation = generator.randrange(7)
        position = generator.randrange(len(tokens)) if tokens else 0
        if operation == 0 and tokens:
            del tokens[position]
        elif operation == 1 and tokens:
            tokens.insert(position, tokens[position])
        elif operation == 2 and len(tokens) > 1:
            other = generator.randrange(len(tokens))
            tokens[position], tokens[other] = tokens[other], tokens[position]
        elif operation == 3:
            tokens.insert(position, generator.choice(VOCABULARY))
        elif operation == 4 and tokens:
            tokens[position] = generator.choice(VOCABULARY)
        elif operation == 5:
            tokens = tokens[: generator.randrange(len(tokens) + 1)]
        else:
            noise = "".join(chr(generator.randrange(0, 0x250)) for _ in range(generator.randint(1, 5)))
            tokens.insert(position, noise)
    return "".join(tokens)


def test_thousands_of_mutated_examples():
    generator = random.Random(20261130)
    accepted = 0
    for index in range(3000):
        text = mutate(EXAMPLE_TEXTS[index % len(EXAMPLE_TEXTS)], generator)
        accepted += assert_only_schedule_errors(text)
    # Some mutations (swapping equal tokens, editing comments) keep the file valid.
    assert 0 < accepted < 3000


def test_random_bytes_through_read_source(tmp_path):
    generator = random.Random(7)
    path = tmp_path / "fuzz.sched"
    for index in range(300):
        base = EXAMPLE_TEXTS[index % len(EXAMPLE_TEXTS)].encode()
        data = bytearray(base[: generator.randrange(len(base) + 1)])
        for _ in range(generator.randint(1, 6)):
            data.insert(generator.randrange(len(data) + 1), generator.randrange(256))
        path.write_bytes(bytes(data))
        try:
            text = read_source(path)
        except ScheduleError as error:
            assert error.diagnostics[0].span.line >= 1
            assert str(path) in error.render()
            continue
        assert_only_schedule_errors(text, str(path))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_arbitrary_text(text):
    assert_only_schedule_errors(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(VOCABULARY), max_size=60), st.sampled_from([" ", "\n", ""]))
def test_sequences_of_language_tokens(tokens, separator):
    assert_only_schedule_errors(separator.join(tokens))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(EXAMPLE_TEXTS))), st.integers(min_value=0, max_value=10_000))
def test_every_truncation_of_an_example(example, cut):
    text = EXAMPLE_TEXTS[example]
    assert_only_schedule_errors(text[: cut % (len(text) + 1)])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(EXAMPLE_TEXTS))),
    st.integers(min_value=0, max_value=1000),
    st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=6),
)
def test_random_values_for_each_key(example, which, value_tokens):
    """A valid file with one key's value replaced by random tokens: reaches the semantic checks."""
    lines = EXAMPLE_TEXTS[example].split("\n")
    assignments = [index for index, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#")]
    index = assignments[which % len(assignments)]
    key = lines[index].split("=")[0]
    lines[index] = key + "= " + " ".join(value_tokens)
    assert_only_schedule_errors("\n".join(lines))
