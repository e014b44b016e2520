"""``pipeline { recompute = [full, none] }``: a recompute mode per stage, from the checker to the memory model,
the cost model and the generated script."""

from __future__ import annotations

import dataclasses

import pytest

from lowering_programs import make_program
from schedlang.frontend import load_program_text
from schedlang.lowering.cost import FlopsCostModel
from schedlang.lowering.memory_peak import predict_memory
from schedlang.vocabulary import LayerKind, Recompute
from schedlang.vocabulary.actions import ActionKind, TaskId

MODES = (Recompute.FULL, Recompute.NONE, Recompute.MLP)


def program_with(recompute):
    program = make_program(3, 4, 2, layers=(LayerKind.GLA, LayerKind.ATTN, LayerKind.GDN) * 2)
    return dataclasses.replace(program, pipeline=dataclasses.replace(program.pipeline, recompute=recompute))


def test_each_stage_predicts_the_memory_of_its_own_mode():
    per_stage = predict_memory(program_with(MODES))
    for stage, mode in enumerate(MODES):
        uniform = predict_memory(program_with(mode))
        assert per_stage[stage].components == uniform[stage].components, (stage, mode)


def test_each_stage_pays_the_rerun_of_its_own_mode():
    per_stage = FlopsCostModel(program_with(MODES))
    for stage, mode in enumerate(MODES):
        uniform = FlopsCostModel(program_with(mode))
        for kind in (ActionKind.FORWARD, ActionKind.BACKWARD):
            task = TaskId(kind, stage, 1, 1)
            assert per_stage.task_duration(task) == uniform.task_duration(task)


SCHEDULE = """schedule per_stage
model {{ vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = [gla] * 4 }}
mesh {{ pipeline = 2 }}
sequence {{ length = 256  chunks = 2 }}
pipeline {{ microbatches = 2  recompute = {recompute} }}
train {{ steps = 1 }}
"""


@pytest.mark.parametrize(
    "written, read",
    [("full", Recompute.FULL), ("[full, none]", (Recompute.FULL, Recompute.NONE)), ("[mlp, mlp]", (Recompute.MLP,) * 2)],
)
def test_the_checker_reads_one_mode_or_one_per_stage(written, read):
    assert load_program_text(SCHEDULE.format(recompute=written)).pipeline.recompute == read
