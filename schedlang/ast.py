"""The syntax tree of a schedule file, as written.

One frozen dataclass per grammar rule of ``schedlang/grammar.lark``, each with
the :class:`~schedlang.vocabulary.source.Span` it was parsed from. Values are kept
raw (an ``IntLiteral`` keeps its text, an ``Identifier`` is not yet a layer
kind or an order): deciding what they mean, and whether they are allowed, is
the semantic pass's job (``schedlang.semantics``), which needs the spans to
point at the offending token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from schedlang.vocabulary import Span


@dataclass(frozen=True)
class IntLiteral:
    value: int
    span: Span


@dataclass(frozen=True)
class FloatLiteral:
    value: float
    text: str
    span: Span


@dataclass(frozen=True)
class StringLiteral:
    value: str  # with escapes resolved and without the quotes
    span: Span


@dataclass(frozen=True)
class Identifier:
    """A bare word: a layer kind, an order name (``1f1b``), ``true``, ``none``..."""

    name: str
    span: Span


@dataclass(frozen=True)
class ListLiteral:
    items: tuple["Item", ...]
    span: Span


@dataclass(frozen=True)
class RepeatList:
    """``[gla, attn] * 2``: the list's items repeated ``count`` times."""

    list: ListLiteral
    count: IntLiteral
    span: Span


@dataclass(frozen=True)
class Argument:
    """``name = value``; a value written alone (``hf("dir")``) has the name ``""``."""

    name: str
    name_span: Span
    value: "Item"
    span: Span


@dataclass(frozen=True)
class Call:
    """``adamw(lr = 3e-3)``: a named constructor with keyword arguments."""

    name: str
    name_span: Span
    arguments: tuple[Argument, ...]
    span: Span


@dataclass(frozen=True)
class EveryClause:
    """``"runs/ckpt" every 50``."""

    value: "Item"
    every: IntLiteral
    span: Span


Item = Union[IntLiteral, FloatLiteral, StringLiteral, Identifier, ListLiteral, RepeatList, Call]
Value = Union[Item, EveryClause]


@dataclass(frozen=True)
class Assignment:
    key: str
    key_span: Span
    value: Value
    span: Span


@dataclass(frozen=True)
class StageTask:
    """One word of a ``stage r:`` line, not yet checked to be ``F<mb>.<chunk>``."""

    text: str
    span: Span


@dataclass(frozen=True)
class StageLine:
    stage: IntLiteral
    tasks: tuple[StageTask, ...]
    span: Span


BlockItem = Union[Assignment, StageLine]


@dataclass(frozen=True)
class Block:
    name: str
    name_span: Span
    items: tuple[BlockItem, ...]
    span: Span


@dataclass(frozen=True)
class Header:
    """``schedule NAME``."""

    name: str
    name_span: Span
    span: Span


@dataclass(frozen=True)
class ScheduleFile:
    header: Header | None
    blocks: tuple[Block, ...]
    span: Span
