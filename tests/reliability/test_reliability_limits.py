"""Bounded work: schedules above the documented limits are refused at the key, passes stay near-linear, and
diagnostics output is bounded whatever the input."""

from __future__ import annotations

import re

import pytest

from reliability_helpers import run_cli
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text
from schedlang.limits import MAX_CHUNKS, MAX_RANKS, MAX_TASKS
from schedlang.lowering.cost import FlopsCostModel
from schedlang.vocabulary import ModelConfig
from schedlang.vocabulary.source_lines import MAX_SHOWN_DIAGNOSTICS

TEMPLATE = """schedule big
model {{ vocab = 64  d_model = 16  heads = 1  head_dim = 16  layers = [gla] * {layers} }}
mesh {{ {mesh} }}
sequence {{ length = {length}  chunks = {chunks}  kernel_chunk = {kernel_chunk} }}
pipeline {{ microbatches = {microbatches}  order = 1f1b }}
train {{ steps = 1 }}
"""


def schedule(layers=2, mesh="pipeline = 2", length=32, chunks=2, kernel_chunk=16, microbatches=2) -> str:
    return TEMPLATE.format(
        layers=layers, mesh=mesh, length=length, chunks=chunks, kernel_chunk=kernel_chunk, microbatches=microbatches
    )


def refusal(text: str) -> str:
    with pytest.raises(ScheduleError) as error:
        load_program_text(text, "big.sched")
    return error.value.render()


def test_too_many_microbatches_are_refused_at_the_key():
    text = schedule(microbatches=1 << 20)
    rendered = refusal(text)
    column = text.splitlines()[4].index("microbatches") + 1
    assert rendered.startswith(f"big.sched:5:{column}: error: the schedule has {2 * 2 * 2 * (1 << 20)} tasks")
    assert f"more than the limit of {MAX_TASKS}" in rendered


def test_too_many_chunks_are_refused_before_the_sequence_is_cut():
    text = schedule(length=1 << 31, chunks=1 << 31, kernel_chunk=1)
    rendered = refusal(text)
    column = text.splitlines()[3].index(str(1 << 31), text.splitlines()[3].index("chunks")) + 1
    assert rendered.startswith(f"big.sched:4:{column}: error: 'sequence.chunks' asks for {1 << 31} chunks")
    assert f"more than the limit of {MAX_CHUNKS}" in rendered


def test_too_many_ranks_are_refused_at_the_largest_dimension():
    text = schedule(mesh="pipeline = 2  data = 65536  sequence = 65536", length=1 << 17, kernel_chunk=1)
    rendered = refusal(text)
    assert f"error: the mesh has {2 * 65536 * 65536} ranks" in rendered
    assert f"more than the limit of {MAX_RANKS}" in rendered
    assert rendered.startswith("big.sched:3:")


def test_run_refuses_more_ranks_than_the_machine_holds(tmp_path):
    path = tmp_path / "wide.sched"
    text = schedule(mesh="pipeline = 2  data = 4096")
    path.write_text(text, encoding="utf-8")
    completed = run_cli("run", path, "--device", "cpu", timeout=120)
    assert completed.returncode == 1
    column = text.splitlines()[2].index("data") + 1
    assert f"{path}:3:{column}: error: the mesh has 8192 ranks, but this machine has" in completed.stderr
    assert "torchrun" not in completed.stderr + completed.stdout


def test_the_flops_cost_model_looks_at_each_layer_kind_once_per_stage(monkeypatch):
    program = load_program_text(schedule(layers=4096, chunks=2), "deep.sched")
    calls = []
    original = ModelConfig.has_mlp

    def counting_has_mlp(self, kind):
        calls.append(kind)
        return original(self, kind)

    monkeypatch.setattr(ModelConfig, "has_mlp", counting_has_mlp)
    FlopsCostModel(program)
    # per stage: launches, linear layers and both chunk costs; not once per layer per chunk
    assert len(calls) <= 10 * program.n_stages * program.n_chunks


def test_diagnostics_output_is_bounded(tmp_path):
    path = tmp_path / "junk.sched"
    body = " ".join(f"unknown_key_{index} = 1" for index in range(5000))
    path.write_text("schedule junk\nmodel { " + body + " }\n", encoding="utf-8")
    completed = run_cli("check", path, timeout=120)
    assert completed.returncode == 1
    assert len(completed.stderr) < 40_000, len(completed.stderr)
    # no line grows with the junk: the longest is at most the hint naming the model block's keys
    from schedlang.checks.schema import BLOCKS

    keys_hint = "   hint: keys of 'model': " + ", ".join(key.name for key in BLOCKS["model"])
    assert max(len(line) for line in completed.stderr.splitlines()) <= max(420, len(keys_hint))
    hidden = re.search(r"\.\.\. and (\d+) more diagnostics not shown\n(\d+) errors\n?$", completed.stderr)
    assert hidden, completed.stderr[-300:]
    assert int(hidden.group(1)) + MAX_SHOWN_DIAGNOSTICS == int(hidden.group(2)) >= 5000


def test_a_clipped_line_keeps_its_caret_under_the_span():
    text = "schedule clip\nmodel { " + "x" * 500 + " = 1  oops = 2 }\n"
    rendered = refusal(text)
    lines = rendered.splitlines()
    index = next(i for i, line in enumerate(lines) if "unknown key 'oops'" in line or "'oops'" in line)
    shown, caret = lines[index + 1], lines[index + 2]
    assert len(shown) <= 170
    assert shown[caret.index("^") : caret.index("^") + 4] == "oops"
