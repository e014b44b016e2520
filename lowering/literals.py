"""A settings record as Python source: a constructor call with keyword arguments of literals.

Contract: :func:`record_literal` takes a frozen dataclass of the vocabulary's settings (``ModelConfig``,
``TrainConfig`` and what they hold) and returns the source that rebuilds an equal record, writing only the
fields without a default or that differ from it; an enum is written as its value (the records convert words
back to their enums), every other value through ``repr``, so no text from the schedule becomes code. Each
record class it writes is added to ``names`` for the script's import line. A call that does not fit in
``width`` columns at its indent gets one argument per line.
"""

from __future__ import annotations

import dataclasses
from enum import Enum

LINE_WIDTH = 120


def _default(field: dataclasses.Field) -> object:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _value_literal(value: object, indent: int, start: int, names: set[str]) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_literal(value, names, indent, start)
    if isinstance(value, Enum):
        return repr(value.value)
    if isinstance(value, tuple):
        items = [_value_literal(item, indent, start, names) for item in value]
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    return repr(value)


def changed_fields(record) -> list[tuple[str, object]]:
    """``(name, value)`` of each field of ``record`` without a default or differing from it, in order."""
    changed = []
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            changed.append((field.name, value))
        elif value != _default(field):
            changed.append((field.name, value))
    return changed


def record_literal(
    record,
    names: set[str],
    indent: int = 0,
    start: int = 0,
    one_per_line: bool = False,
    written: dict[str, str] | None = None,
) -> str:
    """``Name(field=literal, ...)`` for ``record``, written from column ``start`` of a line indented by
    ``indent``; see the module docstring. ``one_per_line`` forces an argument per line (the script's
    top-level records read as a list of settings); ``written`` gives the source of fields the script states
    elsewhere (a name it defines), written whatever their value."""
    name = type(record).__name__
    names.add(name)
    inner = " " * (indent + 4)
    written = written or {}
    arguments = []
    for field, value in changed_fields(record):
        source = written.get(field) or _value_literal(value, indent + 4, indent + 4 + len(field) + 1, names)
        arguments.append(f"{field}={source}")
    one_line = f"{name}({', '.join(arguments)})"
    if not arguments or (not one_per_line and "\n" not in one_line and start + len(one_line) + 1 <= LINE_WIDTH):
        return one_line
    return f"{name}(\n" + "".join(f"{inner}{argument},\n" for argument in arguments) + " " * indent + ")"
