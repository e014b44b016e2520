"""The syntax-error table: each row's examples are the mistakes it names.

As with Lark's ``match_examples``, the examples are the specification of a row:
parsing one must stop in a situation that this row, and no row above it, claims.
"""

import pytest

from schedlang.diagnostics import ScheduleError
from schedlang.parser import parse_text, rejection_situation
from schedlang.syntax_errors import SYNTAX_RULES, first_matching_rule

EXAMPLES = [(index, example) for index, rule in enumerate(SYNTAX_RULES) for example in rule.examples]


@pytest.mark.parametrize(("index", "example"), EXAMPLES, ids=[repr(example) for _, example in EXAMPLES])
def test_each_example_reaches_its_own_row(index, example):
    situation = rejection_situation(example, "t.sched")
    assert situation is not None, "the example parses"
    assert SYNTAX_RULES.index(first_matching_rule(situation)) == index
    with pytest.raises(ScheduleError) as raised:
        parse_text(example, "t.sched")
    assert raised.value.diagnostics == (SYNTAX_RULES[index].diagnose(situation),)


def test_every_row_has_an_example():
    assert all(rule.examples for rule in SYNTAX_RULES)


def test_a_file_that_parses_has_no_rejection():
    assert rejection_situation("schedule t\nmodel { vocab = 1 }\n") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('model { x = "open\n}', "unterminated string"),
        ("model { x = \\ }", "unexpected '\\' outside a string"),
        ("model { x = 1 $ }", "unexpected character '$'"),
        ("model { x = 1 \x01 }", "unexpected character U+0001"),
    ],
)
def test_characters_no_token_starts_with(text, message):
    with pytest.raises(ScheduleError) as raised:
        parse_text(text, "t.sched")
    assert rejection_situation(text) is None
    assert [diagnostic.message for diagnostic in raised.value.diagnostics] == [message]
