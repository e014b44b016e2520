"""Syntax errors by example: an ordered table from parser situations to named messages.

In the style of Lark's ``UnexpectedInput.match_examples``: every common mistake
is one row, with example snippets of the mistake, a test of the parser's
situation when it stopped, and the message it gets. The first row whose test
holds names the error; ``tests/frontend/test_syntax_table.py`` parses every
row's examples and checks that they reach that row, so the examples are the
rows' specification. A situation (:class:`SyntaxSituation`) is what an LALR
parse knows when it rejects a token: the token, the terminals it expected, the
tokens read before it and the brackets still open, so a message can name the
key before a missing ``=`` or the block whose ``{`` was never closed, and point
at the right column.

Characters the lexer cannot read at all are named by a second, smaller table
keyed by the character.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lark import Token

from schedlang.checks.schema import BLOCKS
from schedlang.diagnostics import Diagnostic
from schedlang.vocabulary import Span

CLOSER_OF = {"LBRACE": "RBRACE", "LSQB": "RSQB", "LPAR": "RPAR"}
_BRACKET_TEXT = {"LBRACE": "{", "LSQB": "[", "LPAR": "(", "RBRACE": "}", "RSQB": "]", "RPAR": ")"}
_VALUE_TERMINALS = frozenset({"INT", "FLOAT", "STRING", "NAME", "DIGIT_NAME", "LSQB"})


def token_span(token: Token, filename: str) -> Span:
    line = token.line or 1
    column = token.column or 1
    end_line = token.end_line or line
    end_column = token.end_column or column + 1
    return Span(filename, line, column, end_line, end_column)


def token_end_span(token: Token, filename: str) -> Span:
    """The one column just after ``token``."""
    line = token.end_line or token.line or 1
    column = token.end_column or (token.column or 1) + 1
    return Span(filename, line, column, line, column + 1)


def shown(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    text = str(token)
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


@dataclass(frozen=True)
class SyntaxSituation:
    """Where an LALR parse stopped.

    ``history``: the tokens accepted before ``token`` (which was rejected);
    ``open_brackets``: each bracket still open after ``history``, with the name
    just before it (``model`` of ``model {``); ``expected_text``: the expected
    terminals in words ("'=' or a name").
    """

    token: Token
    expected: frozenset[str]
    history: tuple[Token, ...]
    open_brackets: tuple[tuple[Token, Token | None], ...]
    expected_text: str
    filename: str

    @property
    def previous(self) -> Token | None:
        return self.history[-1] if self.history else None

    @property
    def before_previous(self) -> Token | None:
        return self.history[-2] if len(self.history) >= 2 else None

    @property
    def inside(self) -> str | None:
        """The type of the innermost open bracket (``"LBRACE"``...), or None at top level."""
        return self.open_brackets[-1][0].type if self.open_brackets else None

    @property
    def span(self) -> Span:
        return token_span(self.token, self.filename)

    def previous_is(self, *types: str) -> bool:
        return self.previous is not None and self.previous.type in types

    def before_previous_is(self, *types: str) -> bool:
        return self.before_previous is not None and self.before_previous.type in types


@dataclass(frozen=True)
class SyntaxRule:
    """One named mistake: ``examples`` of it, when it ``applies``, and the diagnostic it gets."""

    examples: tuple[str, ...]
    applies: Callable[[SyntaxSituation], bool]
    diagnose: Callable[[SyntaxSituation], Diagnostic]


def _unclosed(at: SyntaxSituation) -> Diagnostic:
    opening, name_before = at.open_brackets[-1]
    bracket = _BRACKET_TEXT[opening.type]
    closer = _BRACKET_TEXT[CLOSER_OF[opening.type]]
    if opening.type == "LBRACE" and name_before is not None:
        message = f"unclosed '{{' of block '{name_before}'"
    elif opening.type == "LPAR" and name_before is not None:
        message = f"unclosed '(' of '{name_before}(...)'"
    else:
        message = f"unclosed '{bracket}'"
    return Diagnostic.error(message, token_span(opening, at.filename), hint=f"add the matching '{closer}'")


def _end_of_file(at: SyntaxSituation) -> Diagnostic:
    span = token_end_span(at.previous, at.filename) if at.previous else Span(at.filename, 1, 1, 1, 2)
    return Diagnostic.error(f"unexpected end of file; expected {at.expected_text}", span)


def _task_split_by_lexer(at: SyntaxSituation) -> bool:
    """``F0.0`` outside a stage line reads as the name ``F0`` and the number ``.0``, written together."""
    return (
        at.previous_is("NAME")
        and at.token.type == "FLOAT"
        and str(at.token).startswith(".")
        and at.token.start_pos == at.previous.end_pos
    )


def _split_task(at: SyntaxSituation) -> Diagnostic:
    previous, token = at.previous, at.token
    return Diagnostic.error(
        f"unexpected '{previous}{token}'; tasks belong on a `stage N:` line inside the pipeline block",
        Span(at.filename, previous.line, previous.column, token.end_line, token.end_column),
    )


def _block_inside_block(at: SyntaxSituation) -> Diagnostic:
    opening, block_name = at.open_brackets[-1]
    return Diagnostic.error(
        f"missing '}}' before block '{at.previous}'",
        token_span(at.previous, at.filename),
        hint=f"block '{block_name}' opened at line {opening.line} is not closed",
    )


def _value_taken_from_next_line(at: SyntaxSituation) -> Diagnostic:
    key = at.history[-3]
    return Diagnostic.error(
        f"missing value after '{key} ='",
        token_span(at.before_previous, at.filename),
        hint=f"'{at.previous}' on line {at.previous.line} was read as the value of '{key}'",
    )


def _argument_name_then_value(at: SyntaxSituation) -> bool:
    """``adamw(lr 3e-3)``: a name read as a value written alone (``hf("dir")``), then another value."""
    return (
        at.inside == "LPAR"
        and "COMMA" in at.expected
        and at.previous_is("NAME")
        and at.before_previous is not None
        and at.before_previous.type in ("LPAR", "COMMA")
    )


def _missing_equals(at: SyntaxSituation) -> Diagnostic:
    what = "argument" if at.inside == "LPAR" else "key"
    return Diagnostic.error(
        f"missing '=' after {what} '{at.previous}'", at.span, hint=f"write `{at.previous} = <value>`"
    )


def _unmatched_closer(at: SyntaxSituation) -> bool:
    return at.token.type in CLOSER_OF.values() and (
        not at.open_brackets or CLOSER_OF[at.inside] != at.token.type
    )


SYNTAX_RULES: tuple[SyntaxRule, ...] = (
    SyntaxRule(
        ("model {\n  vocab = 256\n", "train { optimizer = adamw(lr = 1\n", "model { layers = [gla"),
        lambda at: at.token.type == "$END" and bool(at.open_brackets),
        _unclosed,
    ),
    SyntaxRule(
        ("schedule", "schedule t\nmodel"),
        lambda at: at.token.type == "$END",
        _end_of_file,
    ),
    SyntaxRule(
        ("pipeline {\n  microbatches = 2\n  F0.0\n}\n",),
        _task_split_by_lexer,
        _split_task,
    ),
    SyntaxRule(
        ("model {\n  vocab = 256\nmesh {\n  pipeline = 2\n}\n",),
        lambda at: at.token.type == "LBRACE" and at.inside == "LBRACE" and at.previous_is("NAME"),
        _block_inside_block,
    ),
    SyntaxRule(
        ("model {\n  d_model =\n  vocab = 256\n}\n",),
        lambda at: (
            at.token.type == "EQUAL"
            and at.previous_is("NAME", "DIGIT_NAME")
            and at.before_previous_is("EQUAL")
            and len(at.history) >= 3
        ),
        _value_taken_from_next_line,
    ),
    SyntaxRule(
        ("pipeline {\n  stage 0: F0.0 F1 B0.0\n}\n", "pipeline { stage 0: x }"),
        lambda at: at.expected == {"EQUAL"} and at.previous_is("NAME") and at.before_previous_is("TASK_RUN", "COLON"),
        lambda at: Diagnostic.error(
            f"'{at.previous}' is not a task",
            token_span(at.previous, at.filename),
            hint="write tasks as F<microbatch>.<chunk> or B<microbatch>.<chunk>, e.g. F0.1",
        ),
    ),
    SyntaxRule(
        ("model { vocab 256 }", "train { optimizer = adamw(lr 3e-3) }"),
        lambda at: (at.expected == {"EQUAL"} and at.previous_is("NAME")) or _argument_name_then_value(at),
        _missing_equals,
    ),
    SyntaxRule(
        ("schedule t\nvocab = 256\n",),
        lambda at: at.inside is None and at.token.type == "EQUAL" and at.previous is not None,
        lambda at: Diagnostic.error(
            f"'{at.previous} = ...' is outside any block",
            token_span(at.previous, at.filename),
            hint="keys belong inside a block, e.g. `model { vocab = 256 }`",
        ),
    ),
    SyntaxRule(
        ("mesh\n  pipeline = 2\n}\n",),
        lambda at: "LBRACE" in at.expected and at.previous_is("NAME") and at.inside is None,
        lambda at: Diagnostic.error(
            f"missing '{{' after block name '{at.previous}'", at.span, hint=f"write `{at.previous} {{ key = value ... }}`"
        ),
    ),
    SyntaxRule(
        ("model {\n  vocab =\n}\n", "model { vocab = , }"),
        lambda at: at.previous_is("EQUAL") and bool(at.expected & _VALUE_TERMINALS),
        lambda at: Diagnostic.error(
            f"missing value after '=', found {shown(at.token)}",
            at.span,
            hint="a value is a number, a string, a name, a list such as [gla] * 4, or a call such as adamw(lr = 3e-3)",
        ),
    ),
    SyntaxRule(
        ("pipeline {\n  stage: F0.0\n}\n",),
        lambda at: at.previous_is("STAGE"),
        lambda at: Diagnostic.error(
            f"expected a stage number after 'stage', found {shown(at.token)}", at.span, hint="write `stage 0: F0.0 B0.0`"
        ),
    ),
    SyntaxRule(
        ("pipeline {\n  stage 0 F0.0\n}\n",),
        lambda at: at.expected == {"COLON"},
        lambda at: Diagnostic.error(
            f"missing ':' after 'stage {at.previous}'", at.span, hint=f"write `stage {at.previous}: F0.0 B0.0`"
        ),
    ),
    SyntaxRule(
        ("model { layers = [gla gla] }",),
        lambda at: at.inside == "LSQB" and {"RSQB", "COMMA"} <= at.expected,
        lambda at: Diagnostic.error(
            f"missing ',' or ']' in the list opened at line {at.open_brackets[-1][0].line}, "
            f"column {at.open_brackets[-1][0].column}; found {shown(at.token)}",
            at.span,
        ),
    ),
    SyntaxRule(
        ("train { optimizer = adamw(lr = 1 weight_decay = 0) }",),
        lambda at: at.inside == "LPAR" and {"RPAR", "COMMA"} <= at.expected,
        lambda at: Diagnostic.error(
            f"missing ',' or ')' in the argument list; found {shown(at.token)}",
            at.span,
            hint="separate arguments with commas: adamw(lr = 3e-3, weight_decay = 0.1)",
        ),
    ),
    SyntaxRule(
        ("mesh {\n  pipeline = 2 }\n}\n", "model { layers = [) }"),
        _unmatched_closer,
        lambda at: Diagnostic.error(f"unmatched '{_BRACKET_TEXT[at.token.type]}'", at.span),
    ),
    SyntaxRule(
        ("model { layers = [gla] * F0.0 }",),
        lambda at: at.token.type == "TASK_RUN",
        lambda at: Diagnostic.error(
            f"unexpected {shown(at.token)}; tasks belong on a `stage N:` line inside the pipeline block", at.span
        ),
    ),
    SyntaxRule(
        ("schedule t\n42\n",),
        lambda at: at.inside is None and "NAME" in at.expected and at.token.type != "NAME",
        lambda at: Diagnostic.error(
            f"expected a block name ({', '.join(BLOCKS)}), found {shown(at.token)}", at.span
        ),
    ),
    SyntaxRule(
        ("model { layers = [gla] * x }",),
        lambda at: True,
        lambda at: Diagnostic.error(f"unexpected {shown(at.token)}; expected {at.expected_text}", at.span),
    ),
)


def first_matching_rule(situation: SyntaxSituation) -> SyntaxRule:
    """The first row of :data:`SYNTAX_RULES` that applies (the last row applies to every situation)."""
    return next(rule for rule in SYNTAX_RULES if rule.applies(situation))


def describe_rejected_token(situation: SyntaxSituation) -> Diagnostic:
    return first_matching_rule(situation).diagnose(situation)


# A character the lexer cannot start a token with: (the character, or None for any, message, hint).
CHARACTER_RULES: tuple[tuple[str | None, Callable[[str], str], str | None], ...] = (
    ('"', lambda character: "unterminated string", "close the string with '\"' on the same line"),
    ("\\", lambda character: "unexpected '\\' outside a string", None),
    (
        None,
        lambda character: "unexpected character "
        + (repr(character) if character.isprintable() else f"U+{ord(character):04X}" if character else "?"),
        None,
    ),
)


def describe_unreadable_character(character: str, span: Span) -> Diagnostic:
    """The diagnostic for ``character`` (``""`` past the end of the text) that no token starts with."""
    message, hint = next(
        (message(character), hint) for matched, message, hint in CHARACTER_RULES if matched in (None, character)
    )
    return Diagnostic.error(message, span, hint=hint)
