"""Counted nouns in messages: ``counted(1, "stage")`` is "1 stage", ``counted(2, "stage")`` "2 stages"."""

from __future__ import annotations


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """``count`` and the noun in the number it agrees with; ``plural`` defaults to ``singular + "s"``."""
    return f"{count} {singular if count == 1 else (plural or singular + 's')}"
