"""``model.value_heads``: grouped value heads of ``gdn`` layers (flash-linear-attention's ``num_v_heads``): the
key's checks with exact positions and the caret, its way into the options and the generated script, and what
the memory and cost models size by it."""

from __future__ import annotations

import runpy
from dataclasses import replace

import pytest

from schedlang.cli import main
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program
from schedlang.vocabulary import GdnOptions

SCHEDULE = """schedule value_heads
model {{
  vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = {layers}
  {keys}
}}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2 }}
"""


def _path(tmp_path, keys: str, layers: str = "[gdn] * 2"):
    path = tmp_path / "s.sched"
    path.write_text(SCHEDULE.format(keys=keys, layers=layers), encoding="utf-8")
    return path


def _errors(path) -> list[tuple[int, int, str]]:
    with pytest.raises(ScheduleError) as raised:
        load_program(path)
    return [(d.span.line, d.span.column, d.message) for d in raised.value.diagnostics]


def test_the_key_builds_the_gdn_options(tmp_path):
    assert load_program(_path(tmp_path, "value_heads = 4")).model.options.gdn == GdnOptions(value_heads=4)
    assert load_program(_path(tmp_path, "value_heads = 6")).model.options.gdn.value_heads_of(2) == 6
    assert load_program(_path(tmp_path, "")).model.options.gdn == GdnOptions()
    assert load_program(_path(tmp_path, "value_heads = 2")).model.options.gdn == GdnOptions()  # = heads: no grouping
    # a model without gdn layers records none
    assert load_program(_path(tmp_path, "value_heads = 4", layers="[gla] * 2")).model.options.gdn == GdnOptions()


@pytest.mark.parametrize("value_heads", [3, 1, 5])
def test_value_heads_not_a_multiple_of_heads_is_an_error_at_the_key(tmp_path, value_heads):
    assert _errors(_path(tmp_path, f"expand_k = 0.5  value_heads = {value_heads}")) == [
        (
            4,
            19,
            f"value_heads = {value_heads} must be a multiple of heads = 2: each query/key head of a gdn layer "
            "serves value_heads / heads value heads",
        )
    ]


def test_value_heads_below_one_is_an_error_at_the_value(tmp_path):
    ((line, column, text),) = _errors(_path(tmp_path, "value_heads = 0"))
    assert (line, column) == (4, 17) and "value_heads" in text


def test_check_prints_the_position_and_a_caret(tmp_path, capsys):
    path = _path(tmp_path, "value_heads = 3")
    assert main(["check", str(path)]) != 0
    output = capsys.readouterr()
    text = output.out + output.err
    assert f"{path}:4:3: error: value_heads = 3 must be a multiple of heads = 2" in text
    lines = text.splitlines()
    source = next(index for index, line in enumerate(lines) if line.strip() == "value_heads = 3")
    assert lines[source + 1].strip().startswith("^") and lines[source + 1].index("^") == lines[source].index("v")


def test_the_generated_script_builds_the_grouped_model(tmp_path):
    path = _path(tmp_path, "delta_gates = mamba  short_conv_size = 4  value_heads = 4")
    assert main(["compile", str(path), "-o", str(tmp_path / "train.py")]) == 0
    model = runpy.run_path(str(tmp_path / "train.py"))["MODEL"]
    assert model.options.gdn.value_heads == 4 and model.heads == 2


def test_the_memory_and_cost_models_size_the_state_by_the_value_heads(tmp_path):
    """The state at a chunk boundary, the sequence-parallel exchange, a pipeline state message, the recurrence
    FLOPs and the v, output-gate, output, alpha and beta projections grow with the value heads (the layer's
    q/k heads stay 2)."""
    from schedlang.lowering.cost import FlopsCostModel, layer_mixer_flops_per_token, layer_projection_flops_per_token
    from schedlang.lowering.memory_terms import sequence_parallel_bytes, state_bytes
    from schedlang.vocabulary.actions import TaskId
    from schedlang.vocabulary.edges import Payload
    from schedlang.vocabulary import LayerKind

    plain = load_program(_path(tmp_path, "expand_k = 1"))
    grouped = load_program(_path(tmp_path, "expand_k = 1  value_heads = 6"))
    assert state_bytes(grouped, 0) == 3 * state_bytes(plain, 0)
    for program in (plain, grouped):
        assert sequence_parallel_bytes(program, 0, 0) == 0.0  # one sequence rank
    sequenced = [replace(program, mesh=replace(program.mesh, sequence=2)) for program in (plain, grouped)]
    assert sequence_parallel_bytes(sequenced[1], 0, 0) == 3 * sequence_parallel_bytes(sequenced[0], 0, 0)
    messages = [
        FlopsCostModel(program).message_bytes(Payload.STATE, TaskId.forward(0, 0, 0), TaskId.forward(0, 0, 1))
        for program in (plain, grouped)
    ]
    assert messages[1] == 3 * messages[0] > 0
    assert layer_mixer_flops_per_token(grouped.model, LayerKind.GDN, 16) > layer_mixer_flops_per_token(
        plain.model, LayerKind.GDN, 16
    )
    d_model, head_dim, more_heads = 32, 16, 6 - 2
    added = layer_projection_flops_per_token(grouped.model, LayerKind.GDN) - layer_projection_flops_per_token(
        plain.model, LayerKind.GDN
    )
    assert added == more_heads * (3 * 2 * d_model * head_dim + 2 * 2 * d_model)
