"""benchmarks/memory_model.py: every case is the checked-in stage schedule revised on the case's keys."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.memory_model import CASES, STAGE_SCHEDULE, case_program
from schedlang.vocabulary import CudaGraphs, LayerKind, Recompute

ARGS = argparse.Namespace(schedule=STAGE_SCHEDULE, length=16384, microbatches=4, steps=3)


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_is_a_schedule_the_checker_accepts(case):
    program = case_program(ARGS, case)
    assert program.sequence.length == 16384 and program.n_microbatches == 4 and program.n_stages == 1
    assert len(program.model.layers) == 8


def test_the_cases_change_what_their_names_say():
    assert case_program(ARGS, "gla-c16").n_chunks == 16 and case_program(ARGS, "gla-c8").n_chunks == 8
    assert case_program(ARGS, "gla-c8-full").pipeline.recompute is Recompute.FULL
    assert case_program(ARGS, "gla-c8-step").pipeline.cuda_graphs is CudaGraphs.STEP
    assert set(case_program(ARGS, "gdn-c8").model.layers) == {LayerKind.GDN}
    hybrid = case_program(ARGS, "hybrid-c8-gqa")
    assert hybrid.model.layers.count(LayerKind.ATTN) == 2
    assert hybrid.model.attention_geometry.heads == 32 and hybrid.model.attention_geometry.kv_heads == 16
