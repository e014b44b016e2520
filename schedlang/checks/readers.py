"""Generic value readers: one syntax-tree value to one Python value, or a diagnostic.

Contract: a reader is called as ``reader(checker, value, path)`` with the
:class:`~schedlang.checks.context.Checker` of the file, the ``ast`` value and the
dotted path the messages name (``"model.vocab"``). It returns the read value, or
reports one or more diagnostics through ``checker.error`` and returns ``None``.
Readers never look at other keys; rules that relate keys live in
``schedlang.checks.rules``.

The reader classes here (:class:`Integer`, :class:`Number`, :class:`Choice`,
:class:`Boolean`) carry their bounds as data, so a row of the key schema states
them where they can be read and documented.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable, TypeVar

from schedlang import ast
from schedlang.vocabulary import Span

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


@dataclass(frozen=True)
class Integer:
    """An integer in ``minimum .. maximum`` (either end open when ``None``)."""

    minimum: int | None = None
    maximum: int | None = None

    def __call__(self, checker: Checker, value: ast.Value, path: str) -> int | None:
        return read_integer(checker, value, path, self.minimum, self.maximum)


@dataclass(frozen=True)
class Number:
    """A finite number: ``>= minimum`` (``> minimum`` when ``above``) and ``< below``."""

    minimum: float | None = None
    above: bool = False
    below: float | None = None

    def __call__(self, checker: Checker, value: ast.Value, path: str) -> float | None:
        return read_number(checker, value, path, self.minimum, self.above, self.below)


@dataclass(frozen=True)
class Choice:
    """A member of ``enum_type`` written by its value; ``noun`` names it in messages."""

    enum_type: type[Enum]
    noun: str

    def __call__(self, checker: Checker, value: ast.Value, path: str) -> Enum | None:
        return read_choice(checker, value, path, self.enum_type, self.noun)


@dataclass(frozen=True)
class Boolean:
    """``true`` or ``false``."""

    def __call__(self, checker: Checker, value: ast.Value, path: str) -> bool | None:
        return read_boolean(checker, value, path)
