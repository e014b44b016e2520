"""The key schema against its records, its text form and the rules."""

from __future__ import annotations

from enum import Enum

import pytest

from schedlang.checks.collect import collect_keys
from schedlang.checks.context import Checker
from schedlang.checks.readers import INVALID
from schedlang.checks.rules import RULES
from schedlang.checks.schema import KEYS, REQUIRED, SCHEMA, STRUCTURED_READERS, Derived, read_key, reader_of
from schedlang.compiler import revise
from schedlang.frontend import load_program_text
from schedlang.lowering.program import MeshSpec, PipelineSpec, SequenceSpec
from schedlang.parser import parse_text
from schedlang.vocabulary import ModelConfig, TrainConfig
from schedlang.vocabulary.keys import Structured


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


@pytest.mark.parametrize("path", sorted(KEYS))
def test_the_default_cell_states_the_rows_default(path):
    """A row's Default cell (docs/language.md is written from the cells: tests/docs/test_key_tables.py) says
    what the row's default is, where that is a plain value."""
    key = KEYS[path]
    cell = key.default_cell
    if key.required:
        assert cell == "required"
        return
    assert cell != "required"
    written = spelled(key.default)
    if written is not None:
        assert cell.replace("`", "") == written


def test_structured_readers_are_exactly_the_structured_rows():
    structured = {key.path for key in SCHEMA if isinstance(key.reader, Structured)}
    assert structured == set(STRUCTURED_READERS)


@pytest.mark.parametrize("path", sorted(KEYS))
def test_every_example_reads_cleanly_through_its_row(path):
    key = KEYS[path]
    assert key.example.startswith(f"{key.name} = ")
    text = f"schedule t\n{key.block} {{ {key.example} }}\n"
    (assignment,) = parse_text(text, "t.sched").blocks[0].items
    checker = Checker(parse_text(text, "t.sched"), text)
    value = reader_of(key)(checker, assignment.value, path)
    assert checker.diagnostics == []
    assert value is not None


def test_defaults_come_from_the_records():
    """A file with only the required keys lowers to the records' own defaults."""
    text = (
        "schedule t\n"
        "model { vocab = 256  d_model = 128  layers = [gla] * 4  heads = 2  head_dim = 64 }\n"
        "sequence { length = 4096 }\n"
        "pipeline { microbatches = 4 }\n"
    )
    program = load_program_text(text, "t.sched")
    assert program.model == ModelConfig(vocab=256, d_model=128, layers=program.model.layers, heads=2, head_dim=64)
    assert program.mesh == MeshSpec()
    assert program.sequence == SequenceSpec(length=4096, boundaries=(0, 4096))
    assert program.pipeline == PipelineSpec(microbatches=4)
    assert program.train == TrainConfig()
    assert program.stage_layers == ((0, 1, 2, 3),)


def test_schema_rows_are_well_formed():
    assert len({key.path for key in SCHEMA}) == len(SCHEMA)
    for key in SCHEMA:
        default = key.default
        assert default is REQUIRED or isinstance(default, Derived) or default is not INVALID, key.path
    for rule in RULES:
        assert set(rule.keys) <= set(KEYS), rule.check


BASE = (
    "schedule t\n"
    "model { vocab = 256  d_model = 128  layers = [gla, gdn, attn, gla]  heads = 2  head_dim = 64 }\n"
    "sequence { length = 4096 }\n"
    "pipeline { microbatches = 4 }\n"
    "train { dtype = fp16  steps = 1000 }\n"
)
NOT_ALONE = {
    "model.stages",
    "model.from",
    "model.expand_v",
    "pipeline.cuda_graphs",
    "pipeline.extra_deferred_weights",
    "pipeline.extra_warmup",
    "pipeline.forward_before_weight",
    "train.master_weights",
    "train.log",
}
"""Keys whose examples need other keys or files than BASE's, and ``train.log``, whose value is a str, which
``revise`` writes as the schedule text it is."""


def _value_read(program, path: str) -> object:
    """The value ``path``'s row reads from ``program``'s schedule text."""
    checker = Checker(parse_text(program.source_text, "t.sched"), program.source_text)
    collect_keys(checker)
    return read_key(checker, path)


@pytest.mark.parametrize("path", sorted(set(KEYS) - NOT_ALONE))
def test_every_value_writes_back_as_the_text_it_is_read_from(path):
    """``Key.text`` (what ``compiler.revise`` writes) is the inverse of the row's reader: the value a file
    with the row's example reads, written back by the row and checked again, reads the same and lowers to the
    same program."""
    key = KEYS[path]
    base = load_program_text(BASE, "t.sched")
    written = revise(base, **{path: key.example.split(" = ", 1)[1]})
    value = _value_read(written, path)
    assert value is not INVALID
    again = revise(base, **{path: value})
    assert _value_read(again, path) == value
    assert again == written
