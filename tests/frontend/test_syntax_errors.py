"""One test per syntax diagnostic of the parser, with its exact line and column."""

import pytest

from schedlang.diagnostics import ScheduleError
from schedlang.parser import parse_text

from .helpers import VALID, replace_line


def syntax_error(text: str) -> tuple[int, int, str, str | None]:
    with pytest.raises(ScheduleError) as raised:
        parse_text(text, "t.sched")
    (diagnostic,) = raised.value.diagnostics
    return diagnostic.span.line, diagnostic.span.column, diagnostic.message, diagnostic.hint


CASES = {
    "missing_equals": (
        replace_line(VALID, 3, "  vocab    256"),
        (3, 12, "missing '=' after key 'vocab'"),
    ),
    "missing_equals_in_call": (
        replace_line(VALID, 22, "  optimizer = adamw(lr 3e-3)"),
        (22, 24, "missing '=' after argument 'lr'"),
    ),
    "unclosed_block": (
        VALID.rstrip().rstrip("}"),
        (21, 7, "unclosed '{' of block 'train'"),
    ),
    "block_inside_block": (
        VALID.replace("}\nmesh {", "\nmesh {", 1),
        (9, 1, "missing '}' before block 'mesh'"),
    ),
    "unclosed_call": (
        VALID + "train2 { x = adamw(lr = 1\n",
        (24, 19, "unclosed '(' of 'adamw(...)'"),
    ),
    "missing_brace_after_block_name": (
        replace_line(VALID, 9, "mesh"),
        (10, 3, "missing '{' after block name 'mesh'"),
    ),
    "missing_value": (
        replace_line(VALID, 4, "  d_model  ="),
        (4, 12, "missing value after 'd_model ='"),
    ),
    "missing_comma_in_list": (
        replace_line(VALID, 5, "  layers   = [gla gla]"),
        (5, 19, "missing ',' or ']' in the list opened at line 5, column 14; found 'gla'"),
    ),
    "missing_comma_in_call": (
        replace_line(VALID, 22, "  optimizer = adamw(lr = 1 weight_decay = 0)"),
        (22, 28, "missing ',' or ')' in the argument list; found 'weight_decay'"),
    ),
    "unmatched_closer": (
        replace_line(VALID, 10, "  pipeline = 2 }"),
        (11, 1, "unmatched '}'"),
    ),
    "unterminated_string": (
        replace_line(VALID, 22, '  checkpoint = "runs every 5'),
        (22, 16, "unterminated string"),
    ),
    "unexpected_character": (
        replace_line(VALID, 6, "  heads    = 2;"),
        (6, 15, "unexpected character ';'"),
    ),
    "key_outside_block": (
        "schedule t\nvocab = 256\n",
        (2, 1, "'vocab = ...' is outside any block"),
    ),
    "stage_without_number": (
        "pipeline {\n  stage: F0.0\n}\n",
        (2, 8, "expected a stage number after 'stage', found ':'"),
    ),
    "stage_without_colon": (
        "pipeline {\n  stage 0 F0.0\n}\n",
        (2, 11, "missing ':' after 'stage 0'"),
    ),
    "task_without_chunk": (
        "pipeline {\n  stage 0: F0.0 F1 B0.0\n}\n",
        (2, 17, "'F1' is not a task"),
    ),
    "end_of_file_after_header": (
        "schedule",
        (1, 9, "unexpected end of file; expected a name"),
    ),
    "task_outside_stage_line": (
        "pipeline {\n  microbatches = 2\n  F0.0\n}\n",
        (3, 3, "unexpected 'F0.0'; tasks belong on a `stage N:` line inside the pipeline block"),
    ),
    "value_where_block_expected": (
        "schedule t\n42\n",
        (2, 1, "expected a block name (model, mesh, sequence, pipeline, train), found '42'"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_syntax_diagnostic(name):
    text, expected = CASES[name]
    line, column, message, _ = syntax_error(text)
    assert (line, column, message) == expected


def test_rendering_shows_source_line_caret_and_hint():
    text = replace_line(VALID, 3, "  vocab    256")
    with pytest.raises(ScheduleError) as raised:
        parse_text(text, "t.sched")
    assert raised.value.render() == (
        "t.sched:3:12: error: missing '=' after key 'vocab'\n"
        "  vocab    256\n"
        "           ^~~\n"
        "  hint: write `vocab = <value>`"
    )


def test_caret_is_aligned_under_tabs():
    with pytest.raises(ScheduleError) as raised:
        parse_text("model {\n\tvocab\t256\n}\n", "t.sched")
    lines = raised.value.render().split("\n")
    assert lines[1] == "\tvocab\t256"
    assert lines[2] == "\t     \t^~~"


def test_comments_of_both_styles_are_ignored():
    tree = parse_text("# hash\nschedule t // slashes\nmodel { # inside\n vocab = 1 // after\n}\n", "t.sched")
    assert tree.header.name == "t"
    assert tree.blocks[0].items[0].key == "vocab"


def test_deep_nesting_is_a_diagnostic_not_a_crash():
    text = "model { layers = " + "[" * 5000 + "gla" + "]" * 5000 + " }"
    with pytest.raises(ScheduleError) as raised:
        parse_text(text, "t.sched")
    assert raised.value.diagnostics[0].span.line == 1


def test_huge_integer_is_a_diagnostic():
    with pytest.raises(ScheduleError) as raised:
        parse_text("model { vocab = " + "9" * 5000 + " }", "t.sched")
    assert "too long" in raised.value.diagnostics[0].message


def test_stage_line_may_continue_over_lines_and_keeps_each_task_span():
    tree = parse_text("pipeline {\n  stage 0: F0.0\tF0.1\n           B0.1  B0.0 # done\n}\n", "t.sched")
    (line,) = tree.blocks[0].items
    assert [task.text for task in line.tasks] == ["F0.0", "F0.1", "B0.1", "B0.0"]
    assert [(task.span.line, task.span.column, task.span.end_column) for task in line.tasks] == [
        (2, 12, 16),
        (2, 17, 21),
        (3, 12, 16),
        (3, 18, 22),
    ]


def test_missing_value_before_closing_brace():
    line, column, message, _ = syntax_error("model {\n  vocab =\n}\n")
    assert (line, column, message) == (3, 1, "missing value after '=', found '}'")
