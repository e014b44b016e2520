"""The row type of the key schema: one ``block.key`` of the language, described once.

A :class:`Key` names the key's reader (its type and bounds as data, or :class:`Structured` for a value with a
form of its own, read by the checker's reader for that key), its default, an example, the fields of the
block's settings record it fills, how a value is written back as schedule text, and the cells of its row in
docs/language.md. The rows of ``model`` and ``train`` sit beside the records they fill
(``model_settings.MODEL_KEYS``, ``train_settings.TRAIN_KEYS``), those of the compiler's own blocks in
``schedlang.checks.schema``, which gathers them all into ``SCHEMA``: the checker, ``compiler.revise`` and the
docs table generator (``python -m schedlang.checks.key_tables``) read that.

This module holds data only: the checker interprets the readers (``schedlang.checks.readers``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Integer:
    """An integer in ``minimum .. maximum`` (either end open when ``None``)."""

    minimum: int | None = None
    maximum: int | None = None
    value_text = "integer"


@dataclass(frozen=True)
class Number:
    """A finite number: ``>= minimum`` (``> minimum`` when ``above``) and ``< below``."""

    minimum: float | None = None
    above: bool = False
    below: float | None = None
    value_text = "number"


@dataclass(frozen=True)
class Boolean:
    """``true`` or ``false``."""

    value_text = "`true` or `false`"


@dataclass(frozen=True)
class Choice:
    """A member of ``enum_type`` written by its value; ``noun`` names it in messages."""

    enum_type: type[Enum]
    noun: str

    @property
    def value_text(self) -> str:
        words = [f"`{member.value}`" for member in self.enum_type]
        return " or ".join(words) if len(words) == 2 else ", ".join(words)


@dataclass(frozen=True)
class Structured:
    """A value of a form of its own (a call, a list, a clause), read by the checker's reader for the key
    (``schedlang.checks.schema.STRUCTURED_READERS``)."""

    value_text = ""


Reader = Integer | Number | Boolean | Choice | Structured


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()
"""The default of a key the file must write (or ``model.from`` give)."""


@dataclass(frozen=True)
class Derived:
    """A default computed from other keys by a rule; ``how`` says how, for docs and readers."""

    how: str


def record_default(record_type: type, field_path: str) -> object:
    """The default of ``field_path`` (``"options.gla.gate_rank"``) of dataclass ``record_type``, as declared."""
    head, _, rest = field_path.partition(".")
    for field in dataclasses.fields(record_type):
        if field.name == head:
            if field.default is not dataclasses.MISSING:
                value = field.default
            elif field.default_factory is not dataclasses.MISSING:
                value = field.default_factory()
            else:
                raise ValueError(f"{record_type.__name__}.{head} has no default")
            return getattr_path(value, rest) if rest else value
    raise ValueError(f"{record_type.__name__} has no field {head}")


def getattr_path(value: object, path: str) -> object:
    for name in path.split("."):
        value = getattr(value, name)
    return value


def schedule_text(value: object) -> str:
    """A value as a schedule writes it: ``true``, ``1f1b``, ``[full, none]``, ``0.003``, a string as written
    (schedule text, such as ``"ring"``), a record with a ``kind`` as the call it is read from
    (``adamw(lr = 0.003)``: the fields that differ from their defaults)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(schedule_text(item) for item in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and hasattr(value, "kind"):
        arguments = []
        for field in dataclasses.fields(value):
            current = getattr(value, field.name)
            if field.name == "kind" or current == record_default(type(value), field.name):
                continue
            written = json.dumps(current, ensure_ascii=False) if isinstance(current, str) else schedule_text(current)
            arguments.append(f"{field.name} = {written}")
        return f"{value.kind.value}({', '.join(arguments)})" if arguments else str(value.kind.value)
    return str(value)


@dataclass(frozen=True)
class Key:
    """One key of one block.

    ``default_from``: a settings record type (the key's default is that record's default for the first field
    in ``fills``), :data:`REQUIRED`, a :class:`Derived`, or the default itself where no field holds it.
    ``fills``: the fields (dotted paths) of the block's record the value is written to; one field takes the
    value, several take the tuple the reader returns (None leaves them at their defaults); empty where the
    block's own builder places the value. None: the field of the key's name.
    ``doc``: the Constraints cell of the key's row in docs/language.md; ``value_doc`` the Value cell (empty:
    the reader's, with "or `none`" when it ``accepts_none``); ``default_doc`` the Default cell (empty: the
    default as the language writes it).
    ``write``: a value as schedule text, for ``compiler.revise`` (:func:`schedule_text` when None).
    ``accepts_none``: the name ``none`` is read as ``None`` (the record's "off").
    ``accepts_every``: the value may be an ``"x" every N`` clause.
    ``in_block_example``: the key is shown (with the required ones) in the example given when its whole block
    is missing.
    """

    block: str
    name: str
    reader: Reader
    default_from: object
    example: str
    doc: str = ""
    value_doc: str = ""
    default_doc: str = ""
    fills: tuple[str, ...] | None = None
    write: Callable[[object], str] | None = None
    accepts_none: bool = False
    accepts_every: bool = False
    in_block_example: bool = False

    @property
    def path(self) -> str:
        return f"{self.block}.{self.name}"

    @property
    def required(self) -> bool:
        return self.default_from is REQUIRED

    @property
    def filled_fields(self) -> tuple[str, ...]:
        return (self.name,) if self.fills is None else self.fills

    @property
    def default(self) -> object:
        """The value an absent key reads as (``REQUIRED`` or a ``Derived`` stand as themselves)."""
        if isinstance(self.default_from, type) and dataclasses.is_dataclass(self.default_from):
            return record_default(self.default_from, self.filled_fields[0])
        return self.default_from

    def text(self, value: object) -> str:
        """``value`` as the schedule writes it at this key: ``none`` for None, a str as the schedule text it is,
        other values through ``write`` (:func:`schedule_text` when None)."""
        if value is None or isinstance(value, str) or self.write is None:
            return schedule_text(value)
        return self.write(value)

    @property
    def value_cell(self) -> str:
        if self.value_doc:
            return self.value_doc
        written = self.reader.value_text
        return f"{written} or `none`" if self.accepts_none else written

    @property
    def default_cell(self) -> str:
        if self.default_doc:
            return self.default_doc
        if self.required:
            return "required"
        default = self.default
        if isinstance(default, Derived):
            return default.how
        if isinstance(default, (bool, Enum)) or default is None:
            return f"`{schedule_text(default)}`"
        return schedule_text(default)

    def table_row(self) -> str:
        """The key's row of docs/language.md's table for its block."""
        return f"| `{self.name}` | {self.value_cell} | {self.default_cell} | {self.doc} |"
