"""Text to syntax tree: the first pass of the front end.

Contract: :func:`parse_text` accepts any string. It returns a
:class:`schedlang.ast.ScheduleFile` whose every node carries a span, or raises
:class:`~schedlang.diagnostics.ScheduleError` with one positioned diagnostic;
no other exception escapes (the fuzz test in ``tests/frontend`` holds it to that).
The parse only checks the shape of the file; names, types and ranges are
checked by ``schedlang.semantics``.

Syntax errors are named from what the LALR parser expected next and the tokens
it had just read (tracked while stepping through an interactive parse), e.g.
``missing '=' after key 'vocab'`` or ``unclosed '{' of block 'model'`` pointing
at the brace that was never closed.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from schedlang import ast
from schedlang.diagnostics import Diagnostic, ScheduleError
from schedlang.vocabulary import Span

# Python refuses to convert longer digit strings; a schedule never needs them.
_MAX_INTEGER_DIGITS = 1000

_CLOSER_OF = {"LBRACE": "RBRACE", "LSQB": "RSQB", "LPAR": "RPAR"}
_BRACKET_TEXT = {"LBRACE": "{", "LSQB": "[", "LPAR": "(", "RBRACE": "}", "RSQB": "]", "RPAR": ")"}

_TERMINAL_DESCRIPTIONS = {
    "NAME": "a name",
    "DIGIT_NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "TASK_RUN": "a task such as F0.0",
    "$END": "end of file",
}
_VALUE_TERMINALS = frozenset({"INT", "FLOAT", "STRING", "NAME", "DIGIT_NAME", "LSQB"})


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


def _parse_tree(text: str, filename: str) -> Tree:
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
        diagnostic = _describe_syntax_error(error, text, filename, history, _open_brackets(history))
        raise _SyntaxFailure(diagnostic) from None
    except LarkError as error:
        span = _token_end_span(history[-1], filename) if history else Span(filename, 1, 1, 1, 2)
        raise _SyntaxFailure(Diagnostic.error(f"cannot read the file: {error}", span)) from None


def _open_brackets(history: list[Token]) -> list[tuple[Token, Token | None]]:
    """The brackets still open after ``history``, each with the name just before it."""
    open_brackets: list[tuple[Token, Token | None]] = []
    previous = None
    for token in history:
        if token.type in _CLOSER_OF:
            open_brackets.append(
                (token, previous if previous is not None and previous.type == "NAME" else None)
            )
        elif token.type in _CLOSER_OF.values() and open_brackets:
            open_brackets.pop()
        previous = token
    return open_brackets


def _token_span(token: Token, filename: str) -> Span:
    line = token.line or 1
    column = token.column or 1
    end_line = token.end_line or line
    end_column = token.end_column or column + 1
    return Span(filename, line, column, end_line, end_column)


def _token_end_span(token: Token, filename: str) -> Span:
    line = token.end_line or token.line or 1
    column = token.end_column or (token.column or 1) + 1
    return Span(filename, line, column, line, column + 1)


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


def _shown(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    text = str(token)
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def _describe_syntax_error(
    error: UnexpectedInput,
    text: str,
    filename: str,
    history: list[Token],
    open_brackets: list[tuple[Token, Token | None]],
) -> Diagnostic:
    if isinstance(error, UnexpectedCharacters):
        return _unexpected_character(error, text, filename)
    if isinstance(error, UnexpectedToken):
        return _unexpected_token(error, filename, history, open_brackets)
    line = getattr(error, "line", 1) or 1
    column = getattr(error, "column", 1) or 1
    return Diagnostic.error("syntax error", Span(filename, line, column, line, column + 1))


def _unexpected_character(error: UnexpectedCharacters, text: str, filename: str) -> Diagnostic:
    line, column = error.line, error.column
    character = text[error.pos_in_stream] if 0 <= error.pos_in_stream < len(text) else ""
    span = Span(filename, line, column, line, column + 1)
    if character == '"':
        return Diagnostic.error(
            "unterminated string", span, hint="close the string with '\"' on the same line"
        )
    if character == "\\":
        return Diagnostic.error("unexpected '\\' outside a string", span)
    shown = repr(character) if character.isprintable() else f"U+{ord(character):04X}" if character else "?"
    return Diagnostic.error(f"unexpected character {shown}", span)


def _unexpected_token(
    error: UnexpectedToken,
    filename: str,
    history: list[Token],
    open_brackets: list[tuple[Token, Token | None]],
) -> Diagnostic:
    token = error.token
    expected = set(error.expected)
    previous = history[-1] if history else None
    before_previous = history[-2] if len(history) >= 2 else None

    if token.type == "$END":
        if open_brackets:
            opening, name_before = open_brackets[-1]
            return _unclosed(opening, name_before, filename)
        span = _token_end_span(previous, filename) if previous else Span(filename, 1, 1, 1, 2)
        return Diagnostic.error(f"unexpected end of file; expected {_expected_list(expected)}", span)

    span = _token_span(token, filename)
    inside = open_brackets[-1][0].type if open_brackets else None

    if (
        previous is not None
        and previous.type == "NAME"
        and token.type == "FLOAT"
        and str(token).startswith(".")
        and token.start_pos == previous.end_pos
    ):
        return Diagnostic.error(
            f"unexpected '{previous}{token}'; tasks belong on a `stage N:` line inside the pipeline block",
            Span(filename, previous.line, previous.column, token.end_line, token.end_column),
        )
    if token.type == "LBRACE" and inside == "LBRACE" and previous is not None and previous.type == "NAME":
        opening, block_name = open_brackets[-1]
        return Diagnostic.error(
            f"missing '}}' before block '{previous}'",
            _token_span(previous, filename),
            hint=f"block '{block_name}' opened at line {opening.line} is not closed",
        )
    if (
        token.type == "EQUAL"
        and previous is not None
        and previous.type in {"NAME", "DIGIT_NAME"}
        and before_previous is not None
        and before_previous.type == "EQUAL"
        and len(history) >= 3
    ):
        key = history[-3]
        return Diagnostic.error(
            f"missing value after '{key} ='",
            _token_span(before_previous, filename),
            hint=f"'{previous}' on line {previous.line} was read as the value of '{key}'",
        )
    if expected == {"EQUAL"} and previous is not None and previous.type == "NAME":
        if before_previous is not None and before_previous.type in {"TASK_RUN", "COLON"}:
            return Diagnostic.error(
                f"'{previous}' is not a task",
                _token_span(previous, filename),
                hint="write tasks as F<microbatch>.<chunk> or B<microbatch>.<chunk>, e.g. F0.1",
            )
        what = "argument" if inside == "LPAR" else "key"
        return Diagnostic.error(
            f"missing '=' after {what} '{previous}'",
            span,
            hint=f"write `{previous} = <value>`",
        )
    if inside is None and token.type == "EQUAL" and previous is not None:
        return Diagnostic.error(
            f"'{previous} = ...' is outside any block",
            _token_span(previous, filename),
            hint="keys belong inside a block, e.g. `model { vocab = 256 }`",
        )
    if "LBRACE" in expected and previous is not None and previous.type == "NAME" and inside is None:
        return Diagnostic.error(
            f"missing '{{' after block name '{previous}'",
            span,
            hint=f"write `{previous} {{ key = value ... }}`",
        )
    if previous is not None and previous.type == "EQUAL" and expected & _VALUE_TERMINALS:
        return Diagnostic.error(
            f"missing value after '=', found {_shown(token)}",
            span,
            hint="a value is a number, a string, a name, a list such as [gla] * 4, or a call such as adamw(lr = 3e-3)",
        )
    if previous is not None and previous.type == "STAGE":
        return Diagnostic.error(
            f"expected a stage number after 'stage', found {_shown(token)}",
            span,
            hint="write `stage 0: F0.0 B0.0`",
        )
    if expected == {"COLON"}:
        return Diagnostic.error(
            f"missing ':' after 'stage {previous}'",
            span,
            hint=f"write `stage {previous}: F0.0 B0.0`",
        )
    if inside == "LSQB" and "RSQB" in expected and "COMMA" in expected:
        opening = open_brackets[-1][0]
        return Diagnostic.error(
            f"missing ',' or ']' in the list opened at line {opening.line}, column {opening.column}; found {_shown(token)}",
            span,
        )
    if inside == "LPAR" and "RPAR" in expected and "COMMA" in expected:
        return Diagnostic.error(
            f"missing ',' or ')' in the argument list; found {_shown(token)}",
            span,
            hint="separate arguments with commas: adamw(lr = 3e-3, weight_decay = 0.1)",
        )
    if token.type in _CLOSER_OF.values() and (not open_brackets or _CLOSER_OF[inside] != token.type):
        return Diagnostic.error(f"unmatched '{_BRACKET_TEXT[token.type]}'", span)
    if token.type == "TASK_RUN":
        return Diagnostic.error(
            f"unexpected {_shown(token)}; tasks belong on a `stage N:` line inside the pipeline block",
            span,
        )
    if inside is None and "NAME" in expected and token.type != "NAME":
        return Diagnostic.error(
            f"expected a block name (model, mesh, sequence, pipeline, train), found {_shown(token)}",
            span,
        )
    return Diagnostic.error(f"unexpected {_shown(token)}; expected {_expected_list(expected)}", span)


def _unclosed(opening: Token, name_before: Token | None, filename: str) -> Diagnostic:
    bracket = _BRACKET_TEXT[opening.type]
    closer = _BRACKET_TEXT[_CLOSER_OF[opening.type]]
    if opening.type == "LBRACE" and name_before is not None:
        message = f"unclosed '{{' of block '{name_before}'"
    elif opening.type == "LPAR" and name_before is not None:
        message = f"unclosed '(' of '{name_before}(...)'"
    else:
        message = f"unclosed '{bracket}'"
    return Diagnostic.error(message, _token_span(opening, filename), hint=f"add the matching '{closer}'")


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
            return _token_span(node, self.filename)
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
        name, value = tree.children
        span = self.span_of(tree, fallback)
        return ast.Argument(str(name), self.span_of(name), self.value(value, span), span)
