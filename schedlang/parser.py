"""Text to syntax tree: the first pass of the front end.

Contract: :func:`parse_text` accepts any string. It returns a
:class:`schedlang.ast.ScheduleFile` whose every node carries a span, or raises
:class:`~schedlang.diagnostics.ScheduleError` with one positioned diagnostic;
no other exception escapes (the fuzz test in ``tests/frontend`` holds it to that).
The parse only checks the shape of the file; names, types and ranges are
checked by ``schedlang.semantics``.

Syntax errors are named by the ordered table of ``schedlang.syntax_errors``
from what the LALR parser expected next and the tokens it had just read
(tracked while stepping through an interactive parse), e.g. ``missing '=' after
key 'vocab'`` or ``unclosed '{' of block 'model'`` pointing at the brace that
was never closed.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from schedlang import ast
from schedlang.diagnostics import Diagnostic, ScheduleError
from schedlang.syntax_errors import (
    CLOSER_OF,
    SyntaxSituation,
    describe_rejected_token,
    describe_unreadable_character,
    token_end_span,
    token_span,
)
from schedlang.vocabulary import Span

# Python refuses to convert longer digit strings; a schedule never needs them.
_MAX_INTEGER_DIGITS = 1000

_TERMINAL_DESCRIPTIONS = {
    "NAME": "a name",
    "DIGIT_NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "TASK_RUN": "a task such as F0.0",
    "$END": "end of file",
}


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark.open(
        "grammar.lark",
        rel_to=__file__,
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=True,
    )


class _SyntaxFailure(Exception):
    """Raised inside this module with a finished diagnostic; becomes a ScheduleError."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def parse_text(text: str, filename: str = "<memory>") -> ast.ScheduleFile:
    """Parse a whole schedule file; see the module docstring for the contract."""
    try:
        tree = _parse_tree(text, filename)
        return _AstBuilder(filename).schedule_file(tree, text)
    except _SyntaxFailure as failure:
        raise ScheduleError([failure.diagnostic], {filename: text}) from None
    except RecursionError:
        diagnostic = Diagnostic.error(
            "the file nests lists or calls too deeply to read", Span(filename, 1, 1, 1, 2)
        )
        raise ScheduleError([diagnostic], {filename: text}) from None


class _Rejected(Exception):
    """The parse stopped at ``error``, after accepting the tokens of ``history``."""

    def __init__(self, error: LarkError, history: list[Token]):
        super().__init__(str(error))
        self.error = error
        self.history = history


def _parse_tree(text: str, filename: str) -> Tree:
    try:
        return _parse_tracking_tokens(text)
    except _Rejected as rejected:
        error, history = rejected.error, rejected.history
        if isinstance(error, UnexpectedInput):
            raise _SyntaxFailure(_describe_syntax_error(error, text, filename, history)) from None
        span = token_end_span(history[-1], filename) if history else Span(filename, 1, 1, 1, 2)
        raise _SyntaxFailure(Diagnostic.error(f"cannot read the file: {error}", span)) from None


def _parse_tracking_tokens(text: str) -> Tree:
    interactive = _lark().parse_interactive(text)
    history: list[Token] = []
    try:
        for token in interactive.iter_parse():
            history.append(token)
        return interactive.feed_eof(history[-1] if history else None)
    except UnexpectedInput as error:
        # iter_parse yields a token before feeding it, so a token the parser
        # rejected is already in the history; one the lexer rejected is not.
        failed = getattr(error, "token", None)
        if failed is not None and history and history[-1] is failed:
            history.pop()
        raise _Rejected(error, history) from None
    except LarkError as error:
        raise _Rejected(error, history) from None


def rejection_situation(text: str, filename: str = "<memory>") -> SyntaxSituation | None:
    """Where the parser rejects a token of ``text``; None when it parses or the lexer stops first."""
    try:
        _parse_tracking_tokens(text)
    except _Rejected as rejected:
        if isinstance(rejected.error, UnexpectedToken):
            return syntax_situation(rejected.error, filename, rejected.history)
    return None


def _open_brackets(history: list[Token]) -> tuple[tuple[Token, Token | None], ...]:
    """The brackets still open after ``history``, each with the name just before it."""
    open_brackets: list[tuple[Token, Token | None]] = []
    previous = None
    for token in history:
        if token.type in CLOSER_OF:
            open_brackets.append((token, previous if previous is not None and previous.type == "NAME" else None))
        elif token.type in CLOSER_OF.values() and open_brackets:
            open_brackets.pop()
        previous = token
    return tuple(open_brackets)


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_DESCRIPTIONS:
        return _TERMINAL_DESCRIPTIONS[terminal]
    try:
        pattern = _lark().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    return f"'{pattern.value}'" if pattern.type == "str" else terminal


def _expected_list(expected: set[str]) -> str:
    descriptions = sorted({_describe(name) for name in expected})
    if len(descriptions) == 1:
        return descriptions[0]
    return ", ".join(descriptions[:-1]) + " or " + descriptions[-1]


def _describe_syntax_error(error: UnexpectedInput, text: str, filename: str, history: list[Token]) -> Diagnostic:
    if isinstance(error, UnexpectedCharacters):
        character = text[error.pos_in_stream] if 0 <= error.pos_in_stream < len(text) else ""
        span = Span(filename, error.line, error.column, error.line, error.column + 1)
        return describe_unreadable_character(character, span)
    if isinstance(error, UnexpectedToken):
        return describe_rejected_token(syntax_situation(error, filename, history))
    line = getattr(error, "line", 1) or 1
    column = getattr(error, "column", 1) or 1
    return Diagnostic.error("syntax error", Span(filename, line, column, line, column + 1))


def syntax_situation(error: UnexpectedToken, filename: str, history: list[Token]) -> SyntaxSituation:
    """What the parse knew when it rejected ``error.token`` after reading ``history``."""
    return SyntaxSituation(
        token=error.token,
        expected=frozenset(error.expected),
        history=tuple(history),
        open_brackets=_open_brackets(history),
        expected_text=_expected_list(set(error.expected)),
        filename=filename,
    )


_WORD = re.compile(r"\S+")
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _unescape(quoted: str) -> str:
    return _ESCAPE.sub(lambda match: _ESCAPED.get(match.group(1), match.group(1)), quoted[1:-1])


class _AstBuilder:
    """Turns Lark's tree into :mod:`schedlang.ast` nodes, copying every position."""

    def __init__(self, filename: str):
        self.filename = filename

    def span_of(self, node: Tree | Token, fallback: Span | None = None) -> Span:
        if isinstance(node, Token):
            return token_span(node, self.filename)
        meta = node.meta
        if getattr(meta, "empty", True):
            return fallback or Span(self.filename, 1, 1, 1, 2)
        return Span(self.filename, meta.line, meta.column, meta.end_line, meta.end_column)

    def schedule_file(self, tree: Tree, text: str) -> ast.ScheduleFile:
        header = None
        blocks = []
        for child in tree.children:
            if child.data == "header":
                name = child.children[0]
                header = ast.Header(str(name), self.span_of(name), self.span_of(child))
            else:
                blocks.append(self.block(child))
        lines = text.split("\n")
        whole = Span(self.filename, 1, 1, len(lines), len(lines[-1]) + 1)
        return ast.ScheduleFile(header, tuple(blocks), whole)

    def block(self, tree: Tree) -> ast.Block:
        name, *items = tree.children
        built = []
        for item in items:
            if item.data == "assignment":
                built.append(self.assignment(item))
            else:
                built.append(self.stage_line(item))
        return ast.Block(str(name), self.span_of(name), tuple(built), self.span_of(tree))

    def assignment(self, tree: Tree) -> ast.Assignment:
        key, value = tree.children
        span = self.span_of(tree)
        return ast.Assignment(str(key), self.span_of(key), self.value(value, span), span)

    def stage_line(self, tree: Tree) -> ast.StageLine:
        stage, *runs = tree.children
        tasks = []
        for run in runs:
            # A run never crosses a line (see TASK_RUN in the grammar), so each
            # word's column is the run's column plus its offset.
            for word in _WORD.finditer(str(run)):
                column = run.column + word.start()
                span = Span(self.filename, run.line, column, run.line, column + len(word.group()))
                tasks.append(ast.StageTask(word.group(), span))
        return ast.StageLine(self.integer(stage), tuple(tasks), self.span_of(tree))

    def integer(self, token: Token) -> ast.IntLiteral:
        span = self.span_of(token)
        digits = str(token).lstrip("+-")
        if len(digits) > _MAX_INTEGER_DIGITS:
            raise _SyntaxFailure(
                Diagnostic.error(f"integer literal with {len(digits)} digits is too long", span)
            )
        return ast.IntLiteral(int(str(token)), span)

    def value(self, tree: Tree, fallback: Span) -> ast.Value:
        span = self.span_of(tree, fallback)
        kind = tree.data
        children = tree.children
        if kind == "int_literal":
            return self.integer(children[0])
        if kind == "float_literal":
            return ast.FloatLiteral(float(str(children[0])), str(children[0]), span)
        if kind == "string_literal":
            return ast.StringLiteral(_unescape(str(children[0])), span)
        if kind == "identifier":
            return ast.Identifier(str(children[0]), span)
        if kind == "list_literal":
            items = tuple(self.value(child, span) for child in children if child is not None)
            return ast.ListLiteral(items, span)
        if kind == "repeat_list":
            listed, count = children
            return ast.RepeatList(self.value(listed, span), self.value(count, span), span)
        if kind == "call":
            name, *arguments = children
            built = tuple(self.argument(argument, span) for argument in arguments if argument is not None)
            return ast.Call(str(name), self.span_of(name), built, span)
        if kind == "every_clause":
            item, every = children
            return ast.EveryClause(self.value(item, span), self.value(every, span), span)
        raise _SyntaxFailure(Diagnostic.error(f"unexpected construct '{kind}'", span))

    def argument(self, tree: Tree, fallback: Span) -> ast.Argument:
        """``name = value``, or a value alone (name ``""``, its name span the value's)."""
        span = self.span_of(tree, fallback)
        if len(tree.children) == 1:
            value = self.value(tree.children[0], span)
            return ast.Argument("", value.span, value, span)
        name, value = tree.children
        return ast.Argument(str(name), self.span_of(name), self.value(value, span), span)
