"""benchmarks/check_scale.py and benchmarks/frontend_parse.py: their schedules are the checked-in scale file
revised to each size, and the explicit variant writes exactly the 1F1B order the implicit one generates."""

from __future__ import annotations

import pytest

from benchmarks.frontend_parse import peer, schedule_text
from benchmarks.pipeline_schedule import scale_text
from schedlang.compiler import Pass, ScheduleText, compile_schedule
from schedlang.lowering.orders import one_f_one_b_orders, stage_orders


@pytest.mark.parametrize("size", [(2, 4, 2), (8, 8, 4), (3, 5, 3)])
def test_each_size_is_the_file_revised(size):
    n_stages, n_microbatches, n_chunks = size
    program = compile_schedule(ScheduleText(scale_text(*size)), through=Pass.CHECK).program
    assert (program.n_stages, program.n_microbatches, program.n_chunks) == size
    assert program.sequence.length == 64 * n_chunks and len(program.model.layers) == n_stages


def test_the_explicit_variant_runs_the_generated_1f1b_order():
    orders = one_f_one_b_orders(4, 4, 3)
    written = [" ".join(task.local_form() for task in order) for order in orders]
    compilation = compile_schedule(ScheduleText(scale_text(4, 4, 3, written)), through=Pass.LEGALITY)
    assert compilation.legality.is_legal
    assert [list(order) for order in stage_orders(compilation.program)] == [list(order) for order in orders]


def test_the_front_end_benchmark_counts_every_task():
    text = schedule_text(2, 4, 2)
    assert peer(text) == 2 * 2 * 4 * 2
    assert compile_schedule(ScheduleText(text), through=Pass.LEGALITY).legality.is_legal
