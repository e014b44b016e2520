"""The schedule file ``schedlang tune -o OUT`` writes: the chosen candidate's text as
:func:`schedlang.compiler.revise` edited it (every unchanged key, comment and line kept as the user wrote
them), with the relative paths it names moved so that they still name the same files from OUT's directory
(schedlang.lowering.paths: a relative path is relative to the schedule file).
"""

from __future__ import annotations

import os
from pathlib import Path

from schedlang import ast
from schedlang.compiler import _offset
from schedlang.parser import parse_text

PATH_KEYS = {("model", "from"), ("train", "data"), ("train", "checkpoint"), ("train", "log")}
"""Keys whose string values are paths, relative to the schedule file."""
NOT_PATHS = {"document_end"}
"""String arguments of those keys that are not paths (a tokenizer's name of a token)."""


def relocated_text(text: str, source_file: str, output: str) -> str:
    """``text`` of a schedule read from ``source_file`` with each relative path rewritten for a file at
    ``output``; unchanged when both lie in one directory."""
    source_directory = Path(source_file).resolve().parent
    output_directory = Path(output).resolve().parent
    if source_directory == output_directory:
        return text
    syntax = parse_text(text, source_file)
    edits = []
    for block in syntax.blocks:
        for item in block.items:
            if isinstance(item, ast.Assignment) and (block.name, item.key) in PATH_KEYS:
                for literal in _path_literals(item.value):
                    if Path(literal.value).is_absolute():
                        continue
                    moved = os.path.relpath(source_directory / literal.value, output_directory)
                    span = literal.span
                    start = _offset(text, span.line, span.column)
                    end = _offset(text, span.end_line, span.end_column)
                    edits.append((start, end, _string_literal(moved)))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _path_literals(value):
    if isinstance(value, ast.StringLiteral):
        yield value
    elif isinstance(value, ast.Call):
        for argument in value.arguments:
            if argument.name not in NOT_PATHS:
                yield from _path_literals(argument.value)
    elif isinstance(value, ast.EveryClause):
        yield from _path_literals(value.value)


def _string_literal(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'
