"""The key schema against the language reference, the spec dataclasses and the rules."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

import pytest

from schedlang.checks.context import Checker
from schedlang.checks.readers import INVALID
from schedlang.checks.rules import RULES
from schedlang.checks.schema import BLOCKS, KEYS, REQUIRED, SCHEMA, Derived
from schedlang.frontend import load_program_text
from schedlang.lowering.program import MeshSpec, MlpSpec, PipelineSpec, SequenceSpec, TrainSpec
from schedlang.parser import parse_text

LANGUAGE_MD = Path(__file__).resolve().parents[2] / "docs" / "language.md"
_SECTION = re.compile(r"^## `([a-z_]+)`$")
_ROW = re.compile(r"^\| `([^`]+)` \| ([^|]*) \| ([^|]*) \|")


def documented_keys() -> dict[str, dict[str, str]]:
    """block -> key -> the Default cell, from the key tables of docs/language.md."""
    tables: dict[str, dict[str, str]] = {}
    block = None
    for line in LANGUAGE_MD.read_text().split("\n"):
        section = _SECTION.match(line)
        if section is not None:
            block = section.group(1)
            tables[block] = {}
            continue
        if line.startswith("## "):
            block = None
        row = _ROW.match(line)
        # A row whose first cell is not a bare name (`stage R: TASK ...`) documents a line, not a key.
        if block is not None and row is not None and re.fullmatch(r"[a-z_]+", row.group(1)):
            tables[block][row.group(1)] = row.group(3).strip()
    return tables


def spelled(value: object) -> str | None:
    """A default as the language writes it, for the plain kinds of value; None for the others."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, int):
        return str(value)
    return None


def test_docs_tables_list_exactly_the_schema_keys():
    documented = documented_keys()
    assert list(documented) == list(BLOCKS)
    for block, keys in BLOCKS.items():
        assert list(documented[block]) == [key.name for key in keys], block


@pytest.mark.parametrize("path", sorted(KEYS))
def test_docs_default_cell_matches_the_schema(path):
    key = KEYS[path]
    cell = documented_keys()[key.block][key.name]
    if key.required:
        assert cell == "required"
        return
    assert cell != "required"
    written = spelled(key.default)
    if written is not None:
        assert cell.replace("`", "") == written


@pytest.mark.parametrize("path", sorted(KEYS))
def test_every_example_reads_cleanly_through_its_row(path):
    key = KEYS[path]
    assert key.example.startswith(f"{key.name} = ")
    text = f"schedule t\n{key.block} {{ {key.example} }}\n"
    (assignment,) = parse_text(text, "t.sched").blocks[0].items
    checker = Checker(parse_text(text, "t.sched"), text)
    value = key.reader(checker, assignment.value, path)
    assert checker.diagnostics == []
    assert value is not None


def test_defaults_come_from_the_spec_dataclasses():
    """A file with only the required keys lowers to the specs' own defaults."""
    text = (
        "schedule t\n"
        "model { vocab = 256  d_model = 128  layers = [gla] * 4  heads = 2  head_dim = 64 }\n"
        "sequence { length = 4096 }\n"
        "pipeline { microbatches = 4 }\n"
    )
    program = load_program_text(text, "t.sched")
    assert program.model.mlp == MlpSpec()
    assert program.mesh == MeshSpec()
    assert program.sequence == SequenceSpec(length=4096, boundaries=(0, 4096))
    assert program.pipeline == PipelineSpec(microbatches=4)
    assert program.train == TrainSpec()
    assert program.stage_layers == ((0, 1, 2, 3),)


def test_schema_rows_are_well_formed():
    assert len({key.path for key in SCHEMA}) == len(SCHEMA)
    for key in SCHEMA:
        default = key.default
        assert default is REQUIRED or isinstance(default, Derived) or default is not INVALID, key.path
    for rule in RULES:
        assert set(rule.keys) <= set(KEYS), rule.check
