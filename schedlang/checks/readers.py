"""Generic value readers: one syntax-tree value to one Python value, or a diagnostic.

Contract: a reader is called as ``reader(checker, value, path)`` with the
:class:`~schedlang.checks.context.Checker` of the file, the ``ast`` value and the
dotted path the messages name (``"model.vocab"``). It returns the read value, or
reports one or more diagnostics through ``checker.error`` and returns ``None``.
Readers never look at other keys; rules that relate keys live in
``schedlang.checks.rules``.

The key schema's rows state plain readers as data (``schedlang.vocabulary.keys``:
``Integer``, ``Number``, ``Choice``, ``Boolean`` with their bounds); :func:`read_bounded`
interprets them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable, TypeVar

from schedlang import ast
from schedlang.vocabulary import Span, keys

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

EnumType = TypeVar("EnumType", bound=Enum)

Reader = Callable[["Checker", ast.Value, str], object]


class _Invalid:
    """The value of a key that was refused, or is required and absent; its problem is reported."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID = _Invalid()


def suggest(word: str, options) -> str | None:
    """The closest of ``options`` to a misspelt ``word``, if any is close."""
    matches = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


def one_of(options) -> str:
    options = list(options)
    return ", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1 else options[0]


def choice_hint(word: str, options) -> str:
    suggestion = suggest(word, options)
    if suggestion is not None:
        return f"did you mean '{suggestion}'? (expected one of {', '.join(options)})"
    return f"expected one of {', '.join(options)}"


def read_integer(
    checker: Checker, value: ast.Value, path: str, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    if not isinstance(value, ast.IntLiteral):
        checker.error(f"'{path}' must be an integer, found '{checker.text_of(value.span)}'", value.span)
        return None
    if minimum is not None and value.value < minimum:
        checker.error(f"'{path}' must be >= {minimum}, found {value.value}", value.span)
        return None
    if maximum is not None and value.value > maximum:
        checker.error(f"'{path}' must be <= {maximum}, found {value.value}", value.span)
        return None
    return value.value


def read_number(
    checker: Checker,
    value: ast.Value,
    path: str,
    minimum: float | None = None,
    above: bool = False,
    below: float | None = None,
) -> float | None:
    """A finite int or float; ``minimum`` inclusive, or exclusive when ``above``; ``below`` exclusive."""
    if not isinstance(value, (ast.IntLiteral, ast.FloatLiteral)):
        checker.error(f"'{path}' must be a number, found '{checker.text_of(value.span)}'", value.span)
        return None
    number = float(value.value)
    if not math.isfinite(number):
        checker.error(f"'{path}' must be a finite number, found '{checker.text_of(value.span)}'", value.span)
        return None
    if minimum is not None and (number <= minimum if above else number < minimum):
        relation = ">" if above else ">="
        checker.error(f"'{path}' must be {relation} {minimum:g}, found {checker.text_of(value.span)}", value.span)
        return None
    if below is not None and number >= below:
        checker.error(f"'{path}' must be < {below:g}, found {checker.text_of(value.span)}", value.span)
        return None
    return number


def read_choice(
    checker: Checker, value: ast.Value, path: str, enum_type: type[EnumType], noun: str
) -> EnumType | None:
    options = [member.value for member in enum_type]
    if isinstance(value, ast.Call) and not value.arguments:
        value = ast.Identifier(value.name, value.span)
    if not isinstance(value, ast.Identifier):
        checker.error(
            f"'{path}' must be one of {one_of(options)}, found '{checker.text_of(value.span)}'", value.span
        )
        return None
    if value.name not in options:
        checker.error(f"unknown {noun} '{value.name}'", value.span, hint=choice_hint(value.name, options))
        return None
    return enum_type(value.name)


def read_boolean(checker: Checker, value: ast.Value, path: str) -> bool | None:
    if isinstance(value, ast.Identifier) and value.name in ("true", "false"):
        return value.name == "true"
    checker.error(f"'{path}' must be true or false, found '{checker.text_of(value.span)}'", value.span)
    return None


@dataclass(frozen=True)
class CallValue:
    """A call or a bare name used as one: ``ring`` is ``ring()``."""

    name: str
    name_span: Span
    arguments: dict[str, ast.Argument]
    span: Span


def read_call(
    checker: Checker,
    value: ast.Value,
    path: str,
    signatures: dict[str, tuple[str, ...]],
    noun: str,
    positional: bool = False,
) -> CallValue | None:
    """A call to one of ``signatures`` (name -> allowed argument names); records each argument's span.

    An argument without a name is refused unless ``positional``, where the first argument may be written
    without its name (the signature's first).
    """
    if isinstance(value, ast.Identifier):
        value = ast.Call(value.name, value.span, (), value.span)
    if not isinstance(value, ast.Call):
        examples = ", ".join(signatures)
        checker.error(
            f"'{path}' must be a {noun} ({examples}), found '{checker.text_of(value.span)}'", value.span
        )
        return None
    if value.name not in signatures:
        checker.error(
            f"unknown {noun} '{value.name}'", value.name_span, hint=choice_hint(value.name, list(signatures))
        )
        return None
    allowed = signatures[value.name]
    arguments: dict[str, ast.Argument] = {}
    for position, argument in enumerate(value.arguments):
        if not argument.name:
            if not (positional and position == 0 and allowed):
                example = f"{allowed[0]} = {checker.text_of(argument.span)}" if allowed else value.name
                checker.error(
                    f"arguments of {value.name} are written name = value", argument.span, hint=f"write `{example}`"
                )
                continue
            argument = dataclasses.replace(argument, name=allowed[0])
        if argument.name not in allowed:
            if allowed:
                suggestion = suggest(argument.name, allowed)
                hint = f"did you mean '{suggestion}'?" if suggestion else f"{value.name} takes {', '.join(allowed)}"
            else:
                hint = f"write just `{value.name}`"
            checker.error(f"unknown argument '{argument.name}' of {value.name}", argument.name_span, hint=hint)
            continue
        if argument.name in arguments:
            checker.error(f"duplicate argument '{argument.name}' of {value.name}", argument.name_span)
            continue
        arguments[argument.name] = argument
        checker.spans[f"{path}.{argument.name}"] = argument.span
    return CallValue(value.name, value.name_span, arguments, value.span)


def read_bounded(checker: Checker, reader: keys.Reader, value: ast.Value, path: str) -> object:
    """``value`` read by a schema row's data reader (``schedlang.vocabulary.keys``): an integer or number in
    its bounds, a boolean, or a member of its enum (not :class:`~schedlang.vocabulary.keys.Structured`)."""
    if isinstance(reader, keys.Integer):
        return read_integer(checker, value, path, reader.minimum, reader.maximum)
    if isinstance(reader, keys.Number):
        return read_number(checker, value, path, reader.minimum, reader.above, reader.below)
    if isinstance(reader, keys.Choice):
        return read_choice(checker, value, path, reader.enum_type, reader.noun)
    if isinstance(reader, keys.Boolean):
        return read_boolean(checker, value, path)
    raise TypeError(f"{path}: {reader!r} is read by its own reader")
