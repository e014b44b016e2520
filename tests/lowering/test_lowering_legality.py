"""Legality messages, exact text, for tiny schedules written as explicit orders."""

from __future__ import annotations

import time

import pytest

from lowering_programs import explicit_program, make_program
from schedlang.lowering.graph import Dependency, task_predecessors
from schedlang.lowering.legality import (
    IllegalScheduleError,
    ViolationKind,
    check_orders,
    execution_order,
    format_step_grid,
    render_report,
)
from schedlang.lowering.orders import one_f_one_b_orders
from schedlang.vocabulary.actions import TaskId


def orders_from_text(*lines: str) -> tuple[tuple[TaskId, ...], ...]:
    return tuple(tuple(TaskId.parse(word) for word in line.split()) for line in lines)


def test_issue_example_explicit_order_is_legal():
    program, _ = explicit_program(
        2, 2, 2, {0: "F0.0 F0.1 F1.0 F1.1 B0.1 B0.0 B1.1 B1.0", 1: "F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0"}
    )
    report = check_orders(program)
    assert report.is_legal
    assert report.summary() == "legal: 2 stages, 2 microbatches, 2 chunks, 16 tasks"


def test_every_kind_of_stage_error_is_reported_with_its_token():
    program, source = explicit_program(
        2, 1, 2, {0: "F0.0 F0.1 B0.0 B0.1 F0.1 F2.0", 1: "F0.0 F0.1 B0.1", 3: "F0.0"}
    )
    report = check_orders(program)
    assert [violation.kind for violation in report.violations] == [
        ViolationKind.DUPLICATE_TASK,
        ViolationKind.UNKNOWN_TASK,
        ViolationKind.UNKNOWN_TASK,
        ViolationKind.MISSING_TASK,
        ViolationKind.ORDER_VIOLATION,
    ]
    assert report.of_kind(ViolationKind.ORDER_VIOLATION)[0].dependency is Dependency.STATE_BACKWARD
    assert render_report(report, {"test.sched": source}) == (
        "test.sched:3:32: error: stage 0 runs F0.1 twice (first at step 1); remove one\n"
        "  stage 0: F0.0 F0.1 B0.0 B0.1 F0.1 F2.0\n"
        "                               ^~~~\n"
        "test.sched:3:37: error: stage 0: F2.0 names microbatch 2, but the pipeline has 1 microbatch (only 0)\n"
        "  stage 0: F0.0 F0.1 B0.0 B0.1 F0.1 F2.0\n"
        "                                    ^~~~\n"
        "test.sched:5:3: error: stage 3 does not exist: the pipeline has 2 stages (0 to 1)\n"
        "  stage 3: F0.0\n"
        "  ^~~~~~~~~~~~~\n"
        "test.sched:4:3: error: stage 1 never runs B0.0 (the backward of microbatch 0, chunk 0)\n"
        "  stage 1: F0.0 F0.1 B0.1\n"
        "  ^~~~~~~~~~~~~~~~~~~~~~~\n"
        "test.sched:3:22: error: stage 0 runs B0.0 (step 2) before B0.1 (step 3), but Eq. 8 requires "
        "B[r,a,i+1] before B[r,a,i]: a chunk's backward consumes the state gradient from the next chunk's "
        "backward; move B0.0 after B0.1\n"
        "  stage 0: F0.0 F0.1 B0.0 B0.1 F0.1 F2.0\n"
        "                     ^~~~\n"
        "illegal: 5 violations (2 stages, 1 microbatch, 2 chunks, 8 tasks)"
    )


@pytest.mark.parametrize(
    ("line", "dependency", "message"),
    [
        (
            "F0.1 F0.0 B0.1 B0.0",
            Dependency.STATE_FORWARD,
            "stage 0 runs F0.1 (step 0) before F0.0 (step 1), but Eq. 8 requires F[r,a,i-1] before F[r,a,i]: "
            "a chunk's forward consumes the recurrent state left by the previous chunk; move F0.1 after F0.0",
        ),
        (
            "F0.0 B0.1 F0.1 B0.0",
            Dependency.FORWARD_BACKWARD,
            "stage 0 runs B0.1 (step 1) before F0.1 (step 2), but Eq. 8 requires F[r,a,i] before B[r,a,i]: "
            "a chunk's backward needs the activations its forward saved; move B0.1 after F0.1",
        ),
    ],
)
def test_order_violation_names_the_constraint(line, dependency, message):
    report = check_orders((1, 1, 2), orders_from_text(" ".join(f"0{word}" for word in line.split())))
    assert [(violation.kind, violation.dependency, violation.message) for violation in report.violations] == [
        (ViolationKind.ORDER_VIOLATION, dependency, message)
    ]


def test_task_on_the_wrong_stage_and_order_for_a_missing_stage():
    report = check_orders((1, 1, 1), orders_from_text("0F0.0 1B0.0", "1F0.0"))
    assert [violation.message for violation in report.violations] == [
        "1B0.0 is in the order of stage 0 but belongs to stage 1",
        "stage 1 does not exist: the pipeline has 1 stage (only 0)",
        "stage 0 never runs B0.0 (the backward of microbatch 0, chunk 0)",
    ]
    assert render_report(report).splitlines()[0] == "error: 1B0.0 is in the order of stage 0 but belongs to stage 1"


def test_chunk_out_of_range():
    report = check_orders((1, 1, 2), orders_from_text("0F0.0 0F0.1 0F0.2 0B0.1 0B0.0"))
    assert [violation.message for violation in report.violations] == [
        "stage 0: F0.2 names chunk 2, but the sequence has 2 chunks (0 to 1)"
    ]


DEADLOCK_RENDERED = """\
test.sched:3:17: error: deadlock: stages 0, 1 wait for each other in a cycle, so none of them can run its next task
  stage 0: F0.0 B0.0 F1.0 B1.0
                ^~~~
  stage 0 is stuck at 0B0.0 (step 1): it needs 1B0.0 (B[r+1,a,i] before B[r,a,i]); stage 1 runs 1B0.0 at step 2, \
after its own stuck task
  stage 1 is stuck at 1F1.0 (step 1): it needs 0F1.0 (F[r-1,a,i] before F[r,a,i]); stage 0 runs 0F1.0 at step 2, \
after its own stuck task

  Step  Stage 0          Stage 1
  0     0F0.0            1F0.0
  1     0B0.0 <-- stuck  1F1.0 <-- stuck
  2     0F1.0            1B0.0
  3     0B1.0            1B1.0
  hint: stage 1 must run 1B0.0 (step 2) before its stuck 1F1.0 (step 1): move it earlier with the tasks it \
needs, or order stage 0 so that 0B0.0 comes after what stage 1 can run first
illegal: 1 violation (2 stages, 2 microbatches, 1 chunk, 8 tasks)"""


def test_deadlock_report_prints_the_cycle_and_the_step_grid():
    program, source = explicit_program(2, 2, 1, {0: "F0.0 B0.0 F1.0 B1.0", 1: "F0.0 F1.0 B0.0 B1.0"})
    report = check_orders(program)
    (deadlock,) = report.violations
    assert deadlock.kind is ViolationKind.DEADLOCK
    assert [(link.stage, link.stuck_task, link.waits_for, link.dependency) for link in deadlock.cycle] == [
        (0, TaskId.parse("0B0.0"), TaskId.parse("1B0.0"), Dependency.STAGE_BACKWARD),
        (1, TaskId.parse("1F1.0"), TaskId.parse("0F1.0"), Dependency.STAGE_FORWARD),
    ]
    assert render_report(report, {"test.sched": source}) == DEADLOCK_RENDERED


def test_deadlock_through_a_missing_stage_is_still_found():
    program, _ = explicit_program(3, 2, 1, {0: "F0.0 B0.0 F1.0 B1.0", 2: "F0.0 F1.0 B0.0 B1.0"})
    report = check_orders(program)
    assert [violation.kind for violation in report.violations] == [ViolationKind.MISSING_TASK] * 4 + [
        ViolationKind.DEADLOCK
    ]
    first, second = report.violations[-1].cycle
    assert first.through_missing == (TaskId.parse("1B0.0"),)
    assert first.next_task == TaskId.parse("2B0.0")
    assert report.violations[-1].details[0] == (
        "stage 0 is stuck at 0B0.0 (step 1): it needs 1B0.0 (B[r+1,a,i] before B[r,a,i]); 1B0.0 is in no order "
        "and needs 2B0.0; stage 2 runs 2B0.0 at step 2, after its own stuck task"
    )
    assert second.through_missing == (TaskId.parse("1F1.0"),)


def test_missing_tasks_alone_do_not_make_a_deadlock():
    orders = [list(order) for order in one_f_one_b_orders(3, 4, 2)]
    del orders[1][5]
    report = check_orders((3, 4, 2), orders)
    assert [violation.kind for violation in report.violations] == [ViolationKind.MISSING_TASK]


def test_three_stage_cycle_is_reported_stage_by_stage():
    # stage 2 runs microbatch 1 first; stage 0 waits for microbatch 0's backward before starting microbatch 1
    orders = orders_from_text(
        "0F0.0 0B0.0 0F1.0 0B1.0",
        "1F0.0 1F1.0 1B1.0 1B0.0",
        "2F1.0 2B1.0 2F0.0 2B0.0",
    )
    report = check_orders((3, 2, 1), orders)
    (deadlock,) = report.violations
    assert [link.stage for link in deadlock.cycle] == [0, 1]
    assert [str(link.stuck_task) for link in deadlock.cycle] == ["0B0.0", "1F1.0"]


def test_step_grid_shows_windows_around_stuck_steps_of_long_orders():
    orders = one_f_one_b_orders(2, 20, 1)
    grid = format_step_grid(orders, [1, 30], context=1)
    assert grid.splitlines() == [
        "Step  Stage 0          Stage 1",
        "0     0F0.0            1F0.0",
        "1     0F1.0 <-- stuck  1B0.0",
        "2     0B0.0            1F1.0",
        "...",
        "29    0F15.0           1B14.0",
        "30    0B14.0           1F15.0 <-- stuck",
        "31    0F16.0           1B15.0",
    ]


def test_execution_order_respects_dependencies_and_rejects_illegal_orders():
    orders = one_f_one_b_orders(3, 3, 2)
    sequence = execution_order((3, 3, 2), orders)
    seen = set()
    for task in sequence:
        assert all(predecessor in seen for predecessor, _ in task_predecessors(task, 3, 2))
        seen.add(task)
    assert len(seen) == 36
    with pytest.raises(IllegalScheduleError) as raised:
        execution_order((1, 1, 1), orders_from_text("0B0.0 0F0.0"))
    assert raised.value.report.violations[0].kind is ViolationKind.ORDER_VIOLATION


def test_program_without_explicit_orders_checks_its_generated_orders():
    assert check_orders(make_program(4, 3, 2)).is_legal


def test_dimensions_need_orders_and_must_be_positive():
    with pytest.raises(ValueError, match="needs orders"):
        check_orders((1, 1, 1))
    with pytest.raises(ValueError, match="n_chunks must be at least 1"):
        check_orders((1, 1, 0), [[]])


def test_the_largest_checked_size_is_legal_and_one_moved_forward_there_deadlocks():
    """64 stages x 64 microbatches x 32 chunks (262,144 tasks). The check is linear in tasks + edges, so even a
    slow run of it stays far inside the bound; a check quadratic in tasks would not."""
    dims = (64, 64, 32)
    orders = [list(order) for order in one_f_one_b_orders(*dims)]
    started = time.perf_counter()
    assert check_orders(dims, orders).is_legal
    # Stage 0 runs 0F1.31 after its first backward, which waits (through stage 1's backward) for stage 1's
    # forward of that very chunk.
    moved = orders[0].pop(orders[0].index(TaskId.parse("0F1.31")))
    orders[0].insert(orders[0].index(TaskId.parse("0B0.31")) + 1, moved)
    report = check_orders(dims, orders)
    assert time.perf_counter() - started < 120
    assert [violation.kind for violation in report.violations] == [ViolationKind.DEADLOCK]
    assert [(link.stage, str(link.stuck_task), link.dependency) for link in report.violations[0].cycle] == [
        (0, "0B0.31", Dependency.STAGE_BACKWARD),
        (1, "1F1.31", Dependency.STAGE_FORWARD),
    ]
