"""``pipeline.recompute`` (none, mlp, mixer, full) and ``pipeline.offload``: read, refused with a position, printed.

The refusals of the runtime's capabilities list (``cuda_graphs`` with recompute or offload) are in
tests/codegen/test_capabilities.py with the other rows.
"""

from __future__ import annotations

import pytest

from schedlang.compiler import ScheduleText, compile_schedule
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text
from schedlang.vocabulary import Recompute

from .helpers import VALID, diagnostics_of, replace_line

PIPELINE_LINE = 19  # "  order        = 1f1b" in VALID


def with_pipeline_keys(keys: str) -> str:
    return replace_line(VALID, PIPELINE_LINE, f"  order        = 1f1b  {keys}")


def column_of(text: str, token: str) -> int:
    return text.split("\n")[PIPELINE_LINE - 1].index(token) + 1


@pytest.mark.parametrize("mode", list(Recompute), ids=lambda mode: mode.value)
def test_every_recompute_mode_is_read_and_printed_into_the_script(mode):
    text = with_pipeline_keys(f"recompute = {mode.value}")
    program = load_program_text(text, "t.sched")
    assert program.pipeline.recompute is mode and program.pipeline.offload is False
    script = compile_schedule(ScheduleText(text, "t.sched")).script
    if mode is Recompute.NONE:  # the pipeline record's default, which the script leaves out
        assert "recompute=" not in script
    else:
        assert f"    recompute={mode.value!r},\n" in script
    assert "offload=" not in script


def test_offload_is_read_and_printed_into_the_script():
    text = with_pipeline_keys("recompute = mixer  offload = true")
    program = load_program_text(text, "t.sched")
    assert program.pipeline.offload is True and program.pipeline.recompute is Recompute.MIXER
    script = compile_schedule(ScheduleText(text, "t.sched")).script
    assert "    recompute='mixer',\n" in script and "    offload=True,\n" in script


def test_the_defaults_are_none_and_no_offload():
    program = load_program_text(VALID, "t.sched")
    assert program.pipeline.recompute is Recompute.NONE and program.pipeline.offload is False
    script = compile_schedule(ScheduleText(VALID, "t.sched")).script
    assert "recompute=" not in script and "offload=" not in script  # the pipeline record's defaults


def test_an_unknown_mode_is_refused_at_its_value_with_a_did_you_mean():
    text = with_pipeline_keys("recompute = mixr")
    assert diagnostics_of(text) == [(PIPELINE_LINE, column_of(text, "mixr"), "unknown recompute mode 'mixr'")]
    with pytest.raises(ScheduleError) as raised:
        load_program_text(text, "t.sched")
    (diagnostic,) = raised.value.diagnostics
    assert diagnostic.hint == "did you mean 'mixer'? (expected one of none, mlp, mixer, full)"
    rendered = raised.value.render()
    assert rendered.startswith(f"t.sched:{PIPELINE_LINE}:{column_of(text, 'mixr')}: error: unknown recompute mode")
    assert rendered.splitlines()[2].strip() == "^~~~"


def test_a_mode_of_the_wrong_type_is_refused_at_its_value():
    text = with_pipeline_keys("recompute = 3")
    assert diagnostics_of(text) == [
        (PIPELINE_LINE, column_of(text, "3"), "'pipeline.recompute' must be one of none, mlp, mixer or full, found '3'")
    ]


def test_offload_must_be_a_boolean():
    text = with_pipeline_keys("offload = yes")
    assert diagnostics_of(text) == [
        (PIPELINE_LINE, column_of(text, "yes"), "'pipeline.offload' must be true or false, found 'yes'")
    ]


def test_offload_with_full_recompute_is_refused_at_offload():
    text = with_pipeline_keys("recompute = full  offload = true")
    ((line, column, message),) = diagnostics_of(text)
    assert (line, column) == (PIPELINE_LINE, column_of(text, "offload"))
    assert message.startswith("'pipeline.offload' keeps the activations a chunk's forward saves in host memory, but "
                              "recompute = full saves none")
    for mode in ("none", "mlp", "mixer"):
        assert load_program_text(with_pipeline_keys(f"recompute = {mode}  offload = true"), "t.sched").pipeline.offload
