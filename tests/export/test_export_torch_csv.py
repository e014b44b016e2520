"""The torch schedule CSV exporter and importer, checked against torch.distributed.pipelining itself.

torch's schedule classes take pipeline stages; their constructors and CSV
loader read only a stage's size, rank and index, so a namespace with those
fields stands in for a real ``PipelineStage`` (which would need a process
group) without changing any torch code.
"""

from __future__ import annotations

import types

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from schedlang.lowering.export.torch_csv import (
    TorchCsvError,
    load_torch_csv,
    parse_torch_csv,
    splits_backward,
    torch_csv_rows,
    torch_action_text,
    torch_csv_text,
    write_torch_csv,
)
from schedlang.lowering.graph import task_predecessors
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders
from schedlang.vocabulary.actions import TaskId

_SHAPES = [(1, 1), (1, 4), (2, 1), (2, 2), (3, 5), (4, 4), (4, 8), (5, 3)]
_GENERATORS = {"gpipe": gpipe_orders, "1f1b": one_f_one_b_orders}


def _stage_stand_in(n_stages: int, rank: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        num_stages=n_stages, group_size=n_stages, group_rank=rank, stage_index=rank, is_last=rank == n_stages - 1
    )


def _dry_run_compute_actions(runtime, n_stages: int) -> int:
    """Compute actions in torch's dry run of the lowered schedule (sends and receives added), which raises if
    it cannot progress; it knows no FSDP actions, which the lowering adds for every schedule, so they are
    dropped."""
    fsdp_actions = {torch_schedules.UNSHARD, torch_schedules.RESHARD, torch_schedules.REDUCE_GRAD}
    with_comms = {
        rank: [action for action in actions if action is None or action.computation_type not in fsdp_actions]
        for rank, actions in runtime.pipeline_order_with_comms.items()
    }
    simulated = torch_schedules._simulate_comms_compute(with_comms, lambda stage: stage, n_stages)
    return sum(action is not None and action.is_compute_op for actions in simulated.values() for action in actions)


def _runtime(n_stages: int, n_microbatches: int) -> torch_schedules._PipelineScheduleRuntime:
    return torch_schedules._PipelineScheduleRuntime([_stage_stand_in(n_stages, 0)], n_microbatches=n_microbatches)


@pytest.mark.parametrize("order", sorted(_GENERATORS))
@pytest.mark.parametrize(("n_stages", "n_microbatches"), _SHAPES)
def test_round_trip(tmp_path, order, n_stages, n_microbatches):
    orders = _GENERATORS[order](n_stages, n_microbatches, 1)
    path = tmp_path / "schedule.csv"
    write_torch_csv(orders, path)
    assert load_torch_csv(path) == orders


@pytest.mark.parametrize("order", sorted(_GENERATORS))
@pytest.mark.parametrize(("n_stages", "n_microbatches"), _SHAPES)
def test_steps_are_earliest_lockstep(order, n_stages, n_microbatches):
    """Each task sits after all its dependencies' steps, and every idle cell is a real wait."""
    orders = _GENERATORS[order](n_stages, n_microbatches, 1)
    grid = torch_csv_rows(orders)
    assert len({len(row) for row in grid}) == 1, "the grid is rectangular"
    step_of = {task: step for row in grid for step, task in enumerate(row) if task is not None}
    for stage, row in enumerate(grid):
        assert [task for task in row if task is not None] == list(orders[stage])
        for step, task in enumerate(row):
            if task is not None:
                assert all(step_of[before] < step for before, _ in task_predecessors(task, n_stages, 1))
        for step, cell in enumerate(row):
            upcoming = [task for task in row[step:] if task is not None]
            if cell is None and upcoming:
                waiting_for = [step_of[before] for before, _ in task_predecessors(upcoming[0], n_stages, 1)]
                assert max(waiting_for) >= step, f"rank {stage} idles at step {step} with {upcoming[0]} ready"
    assert any(cell is not None for row in grid for cell in row[-1:])


def test_one_f_one_b_layout_is_the_familiar_staircase():
    assert torch_csv_text(one_f_one_b_orders(3, 4, 1)) == (
        "0F0,0F1,0F2,,,0B0,0F3,0B1,,0B2,,0B3\n"
        ",1F0,1F1,,1B0,1F2,1B1,1F3,1B2,,1B3,\n"
        ",,2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3,,\n"
    )


@pytest.mark.parametrize("order", sorted(_GENERATORS))
@pytest.mark.parametrize(("n_stages", "n_microbatches"), [(2, 2), (4, 4), (3, 6)])
def test_torch_runtime_loads_and_simulates_what_we_write(tmp_path, order, n_stages, n_microbatches):
    orders = _GENERATORS[order](n_stages, n_microbatches, 1)
    path = tmp_path / "schedule.csv"
    write_torch_csv(orders, path)
    runtime = _runtime(n_stages, n_microbatches)
    runtime._load_csv(str(path))

    grid = torch_csv_rows(orders)
    for rank in range(n_stages):
        loaded = [None if action is None else str(action) for action in runtime.pipeline_order[rank]]
        assert loaded == [None if task is None else torch_action_text(task) for task in grid[rank]]
    assert runtime.stage_index_to_group_rank == {stage: stage for stage in range(n_stages)}

    assert _dry_run_compute_actions(runtime, n_stages) == 2 * n_stages * n_microbatches


@pytest.mark.parametrize(("n_stages", "n_microbatches"), [(2, 2), (4, 4), (3, 6)])
def test_lockstep_matches_torch_own_step_layout(n_stages, n_microbatches):
    """Laying out torch's LoopedBFS orders gives back the grid torch generated for them."""
    expected = {}
    for rank in range(n_stages):
        schedule = torch_schedules.ScheduleLoopedBFS([_stage_stand_in(n_stages, rank)], n_microbatches=n_microbatches)
        expected[rank] = [None if action is None else str(action) for action in schedule.pipeline_order[rank]]
    orders = parse_torch_csv(
        "\n".join(",".join("" if cell is None else cell for cell in expected[rank]) for rank in range(n_stages))
    )
    grid = torch_csv_rows(orders)
    for rank in range(n_stages):
        ours = [None if task is None else torch_action_text(task) for task in grid[rank]]
        assert ours[: len(expected[rank])] == expected[rank]
        assert all(cell is None for cell in ours[len(expected[rank]) :])


def test_every_cell_parses_with_torch_action_parser():
    for line in torch_csv_text(one_f_one_b_orders(4, 6, 1)).splitlines():
        for cell in line.split(","):
            action = torch_schedules._Action.from_str(cell)
            assert (action is None) == (cell == "")
            if action is not None:
                assert str(action) == cell


@pytest.mark.parametrize("n_chunks", [2, 4])
def test_chunked_schedule_is_written_with_its_state_order(n_chunks):
    """Chunk i of microbatch a is torch microbatch a * n_chunks + i, and a rank's cells keep Eq. 8's state
    order: a microbatch's forwards by rising chunk, its backwards by falling chunk, on every rank."""
    grid = torch_csv_rows(one_f_one_b_orders(2, 2, n_chunks), n_chunks=n_chunks)
    for row in grid:
        tasks = [task for task in row if task is not None]
        for microbatch in range(2):
            forwards = [task.chunk for task in tasks if task.microbatch == microbatch and task.kind.value == "F"]
            backwards = [task.chunk for task in tasks if task.microbatch == microbatch and task.kind.value == "B"]
            assert forwards == list(range(n_chunks)) and backwards == list(reversed(range(n_chunks)))
    cells = torch_csv_text(one_f_one_b_orders(2, 2, n_chunks), n_chunks).splitlines()[0].split(",")
    assert cells[: n_chunks + 1] == [f"0F{m}" for m in range(n_chunks + 1)]


def test_chunk_task_in_a_one_chunk_schedule_is_refused():
    orders = ((TaskId.forward(0, 0, 1), TaskId.backward(0, 0, 1)),)
    with pytest.raises(TorchCsvError, match="names chunk 1"):
        torch_csv_rows(orders)


def test_deadlocked_orders_are_reported_not_looped():
    orders = (
        (TaskId.forward(0, 0, 0), TaskId.backward(0, 0, 0)),
        (TaskId.backward(1, 0, 0), TaskId.forward(1, 0, 0)),
    )
    expected = r"at step 1 no rank can make progress.*rank 1 waits to run 1B0\.0 for 1F0\.0"
    with pytest.raises(TorchCsvError, match=expected):
        torch_csv_rows(orders)


def test_task_on_the_wrong_stage_is_refused():
    with pytest.raises(TorchCsvError, match="1F0.0 is in stage 0's order"):
        torch_csv_rows(((TaskId.forward(1, 0, 0),), ()))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0,0SEND_F0", r"cell 2: error: cannot read action '0SEND_F0': it is a communication"),
        ("0F0,F0", r"cell 2: error: cannot read action 'F0': expected <stage><F\|B\|I\|W><microbatch>"),
        ("0F0,0B0\n0F1", r"sched\.csv:2: cell 1: error: action '0F1' runs stage 0 on rank 1"),
    ],
)
def test_import_errors_point_at_the_cell(text, message):
    with pytest.raises(TorchCsvError, match=message):
        parse_torch_csv(text, "sched.csv")


def test_import_skips_idle_and_blank_cells():
    assert parse_torch_csv("0F0, ,,0B0\n,1F0,1B0\n") == (
        (TaskId.forward(0, 0, 0), TaskId.backward(0, 0, 0)),
        (TaskId.forward(1, 0, 0), TaskId.backward(1, 0, 0)),
    )


def _split_orders(order: str, n_stages: int, n_microbatches: int):
    return _GENERATORS[order](n_stages, n_microbatches, 1, split_backward=True)


@pytest.mark.parametrize("order", sorted(_GENERATORS))
@pytest.mark.parametrize(("n_stages", "n_microbatches"), _SHAPES)
def test_split_backward_round_trip(tmp_path, order, n_stages, n_microbatches):
    orders = _split_orders(order, n_stages, n_microbatches)
    path = tmp_path / "schedule.csv"
    write_torch_csv(orders, path)
    cells = [cell for line in path.read_text().splitlines() for cell in line.split(",") if cell]
    letters = {cell.lstrip("0123456789")[0] for cell in cells}
    assert letters == {"F", "I", "W"}, "a split program's backward is torch's I, its weight gradients W, never B"
    loaded = load_torch_csv(path)
    assert loaded == orders and splits_backward(loaded)


def test_split_one_f_one_b_layout():
    assert torch_csv_text(one_f_one_b_orders(3, 4, 1, split_backward=True)) == (
        "0F0,0F1,0F2,,,0I0,0W0,0F3,0I1,0W1,,0I2,0W2,0I3,0W3,\n"
        ",1F0,1F1,,1I0,1W0,1F2,1I1,1F3,,1I2,,1I3,1W1,1W2,1W3\n"
        ",,2F0,2I0,2W0,2F1,2I1,2W1,2F2,2I2,2F3,2I3,2W2,2W3,,\n"
    )
    assert torch_action_text(TaskId.backward(1, 2, 0), split_backward=True) == "1I2"
    assert torch_action_text(TaskId.weight(1, 2, 0), split_backward=True) == "1W2"


@pytest.mark.parametrize("order", sorted(_GENERATORS))
@pytest.mark.parametrize(("n_stages", "n_microbatches"), [(2, 2), (4, 4), (3, 6)])
def test_torch_runtime_loads_and_simulates_split_backwards(tmp_path, order, n_stages, n_microbatches):
    orders = _split_orders(order, n_stages, n_microbatches)
    path = tmp_path / "schedule.csv"
    write_torch_csv(orders, path)
    runtime = _runtime(n_stages, n_microbatches)
    runtime._load_csv(str(path))
    kinds = {
        action.computation_type for actions in runtime.pipeline_order.values() for action in actions if action
    }
    assert kinds == {torch_schedules.FORWARD, torch_schedules.BACKWARD_INPUT, torch_schedules.BACKWARD_WEIGHT}
    assert _dry_run_compute_actions(runtime, n_stages) == 3 * n_stages * n_microbatches


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "0F0,0I0,0W0\n,1F0,1B0",
            r"sched\.csv:2: cell 3: error: a full backward \(B\) in a file with split backwards \(I, first at "
            r"sched\.csv:1: cell 2\)",
        ),
        ("0F0,0B0,0W0", r"sched\.csv:1: cell 2: error: a full backward \(B\) in a file with split backwards \(W"),
        ("0F0,0I0", r"sched\.csv:1: cell 2: error: the file splits backwards \(I, the input gradients\) but has no W"),
    ],
)
def test_full_and_split_backwards_do_not_mix(text, message):
    with pytest.raises(TorchCsvError, match=message):
        parse_torch_csv(text, "sched.csv")
