"""The first check: sort a file's blocks and keys by the key schema.

Contract: :func:`collect_keys` fills ``checker.blocks``, ``checker.assignments``
(by ``"block.key"``), ``checker.stage_lines`` and the spans of the header,
blocks and keys, and reports what the schema alone decides: a missing header,
unknown or repeated blocks and keys, stage lines outside the pipeline block,
missing required blocks and keys (a model block with ``from`` may leave its required keys to it).
Values are not read here.
"""

from __future__ import annotations

from schedlang import ast
from schedlang.checks.context import Checker
from schedlang.checks.readers import suggest
from schedlang.checks.schema import BLOCKS, FROM_KEY, KEYS, block_example, required_blocks
from schedlang.vocabulary import Span


def collect_keys(checker: Checker) -> None:
    schedule = checker.schedule
    if schedule.header is None:
        checker.error(
            "the file does not start with 'schedule NAME'",
            Span(checker.filename, 1, 1, 1, 2),
            hint="add a first line such as `schedule my_schedule`",
        )
    else:
        checker.spans["schedule"] = schedule.header.name_span
    for block in schedule.blocks:
        if block.name not in BLOCKS:
            suggestion = suggest(block.name, BLOCKS)
            checker.error(
                f"unknown block '{block.name}' (expected one of {', '.join(BLOCKS)})",
                block.name_span,
                hint=f"did you mean '{suggestion}'?" if suggestion else None,
            )
            continue
        if block.name in checker.blocks:
            first = checker.blocks[block.name].name_span
            checker.error(
                f"duplicate block '{block.name}' (first written at line {first.line})",
                block.name_span,
                hint="merge the two blocks into one",
            )
            continue
        checker.blocks[block.name] = block
        checker.spans[block.name] = block.name_span
        for item in block.items:
            if isinstance(item, ast.StageLine):
                if block.name == "pipeline":
                    checker.stage_lines.append(item)
                else:
                    checker.error(f"'stage' lines belong in the pipeline block, not in '{block.name}'", item.span)
                continue
            _collect_key(checker, block.name, item)
    for block_name in required_blocks():
        if block_name not in checker.blocks:
            checker.error(
                f"missing block '{block_name}'", checker.file_start(), hint=f"add `{block_example(block_name)}`"
            )
    for block_name, keys in BLOCKS.items():
        if block_name not in checker.blocks:
            continue
        imported = block_name == "model" and checker.given(FROM_KEY)
        for key in keys:
            if key.required and not checker.given(key.path) and not imported:
                checker.error(
                    f"block '{block_name}' is missing required key '{key.name}'",
                    checker.blocks[block_name].name_span,
                    hint=f"add e.g. `{key.example}`",
                )


def _collect_key(checker: Checker, block_name: str, assignment: ast.Assignment) -> None:
    path = f"{block_name}.{assignment.key}"
    if path not in KEYS:
        names = [key.name for key in BLOCKS[block_name]]
        suggestion = suggest(assignment.key, names)
        hint = f"did you mean '{suggestion}'?" if suggestion else f"keys of '{block_name}': {', '.join(names)}"
        checker.error(f"unknown key '{assignment.key}' in block '{block_name}'", assignment.key_span, hint=hint)
        return
    existing = checker.assignments.get(path)
    if existing is not None:
        checker.error(
            f"duplicate key '{path}' (first set at line {existing.key_span.line})",
            assignment.key_span,
            hint="keep one of the two",
        )
        return
    checker.assignments[path] = assignment
    checker.spans[path] = assignment.span
