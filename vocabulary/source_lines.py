"""Bounded pictures of source lines for diagnostics.

A file of unknown keys on one 100 KB line would otherwise print that line once per error: output
quadratic in the input. Each source is split into lines once per report, a shown line is clipped to
``MAX_SHOWN_LINE`` characters around the span (``...`` marks what was cut), a message to its sentences
that fit in ``MAX_SHOWN_MESSAGE`` characters, and a report shows at most ``MAX_SHOWN_DIAGNOSTICS``
diagnostics, then says how many more there are.

Before any of that, :func:`normalize_source_text` gives every reader of a schedule file the same text
(schedlang.frontend.read_source applies it; render_message in schedlang.vocabulary.source the bounds): a UTF-8 byte-order mark is dropped and ``\r\n`` and lone
``\r`` line ends become ``\n``, which is the only line end Lark counts, so a file saved with classic Mac
line ends gets right line numbers. Text given in memory is parsed as it is.
"""

from __future__ import annotations

import dataclasses

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedlang.vocabulary.source import Span

MAX_SHOWN_DIAGNOSTICS = 50
MAX_SHOWN_LINE = 160
MAX_SHOWN_MESSAGE = 1000
ELLIPSIS = "..."


BYTE_ORDER_MARK = "\ufeff"


def normalize_source_text(text: str) -> str:
    """``text`` without a leading byte-order mark and with ``\n`` line ends only (columns are unchanged)."""
    text = text.removeprefix(BYTE_ORDER_MARK)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def split_source(text: str) -> list[str]:
    """The lines as Lark counts them: at ``\\n`` only (not at form feeds), without a trailing ``\\r``."""
    return [line.rstrip("\r") for line in text.split("\n")]


def clip_text(text: str, limit: int = MAX_SHOWN_MESSAGE) -> str:
    """``text`` when it fits in ``limit`` characters; else its whole sentences or clauses (ending ``.`` or
    ``;``) that fit, then `` ...``: a message is never cut mid-sentence. Only a first sentence longer than
    the limit (a huge name quoted from the input) is cut, at a space when there is one."""
    if len(text) <= limit:
        return text
    room = text[: limit - len(ELLIPSIS) - 1]
    for separator in (". ", "; "):
        cut = room.rfind(separator)
        if cut > 0:
            return room[: cut + 1] + " " + ELLIPSIS
    cut = room.rfind(" ")
    return (room[:cut] if cut > 0 else room) + " " + ELLIPSIS


def clip_source_line(line: str, span: Span) -> tuple[str, Span]:
    """``line`` cut to at most ``MAX_SHOWN_LINE`` characters around the span's start, and the span moved to
    match (its end clipped to what is shown)."""
    if len(line) <= MAX_SHOWN_LINE:
        return line, span
    start = max(0, min(span.column - 1 - MAX_SHOWN_LINE // 4, len(line) - MAX_SHOWN_LINE))
    end = start + MAX_SHOWN_LINE
    prefix = ELLIPSIS if start > 0 else ""
    suffix = ELLIPSIS if end < len(line) else ""
    shown = prefix + line[start:end] + suffix
    shift = len(prefix) - start
    column = span.column + shift
    end_column = min(span.end_column + shift, len(prefix) + (end - start) + 1) if span.end_line == span.line else 0
    return shown, dataclasses.replace(span, column=column, end_column=max(end_column, column + 1))


def more_diagnostics_line(hidden: int) -> str:
    return f"... and {hidden} more diagnostic{'s' if hidden != 1 else ''} not shown"
