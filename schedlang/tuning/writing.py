"""The schedule file ``schedlang tune -o OUT`` writes: the file's own text with the chosen candidate's changes
(every unchanged key, comment and line kept as the user wrote them), with the relative paths it names moved so
that they still name the same files from OUT's directory (schedlang.lowering.paths: a relative path is relative to
the schedule file).

A changed key is rewritten in place, as :func:`schedlang.compiler.revise` writes it; a key the file leaves out is
added on a line of its own before its block's closing brace, indented and aligned like the block's other keys
(``revise`` puts it on the brace's line so that no line moves, which suits diagnostics, not a file to keep); a
block the file leaves out is added at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

from schedlang import ast
from schedlang.compiler import key_literal
from schedlang.parser import parse_text
from schedlang.vocabulary.source import apply_edits

PATH_KEYS = {("model", "from"), ("train", "data"), ("train", "checkpoint"), ("train", "log")}
"""Keys whose string values are paths, relative to the schedule file."""
NOT_PATHS = {"document_end"}
"""String arguments of those keys that are not paths (a tokenizer's name of a token)."""


def tuned_text(text: str, filename: str, changes: dict) -> str:
    """``text`` with ``changes`` (``block.key``: value, as :func:`schedlang.compiler.revise` takes them) written in:
    see the module docstring."""
    syntax = parse_text(text, filename)
    edits, new_blocks = [], {}
    for name, value in changes.items():
        block_name, key = name.split(".", 1)
        literal = key_literal(name, value)
        block = next((block for block in syntax.blocks if block.name == block_name), None)
        if block is None:
            new_blocks.setdefault(block_name, []).append(f"  {key} = {literal}\n")
            continue
        assignments = [item for item in block.items if isinstance(item, ast.Assignment)]
        written = next((item for item in assignments if item.key == key), None)
        if written is not None:
            edits.append((*written.value.span.offsets(text), literal))
            continue
        edits.append(_added_line(text, block, assignments, key, literal))
    text = apply_edits(text, edits)
    for block_name, lines in new_blocks.items():
        text = text.rstrip("\n") + f"\n\n{block_name} {{\n" + "".join(lines) + "}\n"
    return text


def _added_line(text: str, block: ast.Block, assignments, key: str, literal: str) -> tuple[int, int, str]:
    """The edit that adds ``key = literal`` to ``block``: a line of its own before the closing brace when the brace
    starts its line, else before the brace on its line."""
    closing = text.rfind("}", 0, block.span.offsets(text)[1])
    line_start = text.rfind("\n", 0, closing) + 1
    if text[line_start:closing].strip():
        return closing, closing, f" {key} = {literal} "
    indent, key_width = "  ", len(key)
    if assignments:
        first = assignments[0].key_span
        indent = " " * (first.column - 1)
        line = text.split("\n")[first.line - 1]
        equals = line.find("=", first.column - 1 + len(assignments[0].key))
        key_width = max(key_width, equals - (first.column - 1) - 1)
    return line_start, line_start, f"{indent}{key.ljust(key_width)} = {literal}\n"


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
                    edits.append((*literal.span.offsets(text), _string_literal(moved)))
    return apply_edits(text, edits)


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
