"""The legality pass: are the per-stage program orders a legal, deadlock-free schedule?

(One module over 500 lines: the report types, the four checks and the deadlock's cycle and step grid all
work on the private task numbering below, which no other pass should see.)

Input: the dimensions (stages P, microbatches M, chunks N), whether the
backward is split (``pipeline { split_backward = true }``: every ``(r, a, i)``
then also has a ``W`` task, which must follow its ``B``; [Note: split
backward] in schedlang.lowering.orders), and one order per stage, either a
program's own orders (explicit ``stage r:`` lines keep the span of every task
token) or orders given by the caller. Nothing about the orders is assumed:
they may name tasks outside the graph, repeat or omit tasks, and contradict
Eq. 8.

Output: a :class:`LegalityReport` listing every violation found: first the
unknown and duplicate tasks in the order they were written, then the missing
tasks, the order violations, and at most one deadlock.

* ``UNKNOWN_TASK``: a microbatch or chunk out of range, a task listed on
  another stage's order, a ``W`` task when the backward is not split, or an
  order for a stage that does not exist. Such tasks are dropped before the
  later checks.
* ``DUPLICATE_TASK``: a task listed twice on its stage; only the first
  occurrence is kept.
* ``MISSING_TASK``: a task of the graph that no order runs (with a split
  backward, every ``W`` too); it points at its stage's line when there is one.
* ``ORDER_VIOLATION``: on one stage, a task placed before one of its
  same-stage predecessors (by a rule that keeps the stage, such as ``B``
  before ``W``); the cross-stage constraints can only be broken through a
  cycle, which the deadlock check reports.
* ``DEADLOCK``: the orders plus the dependency edges form a cycle. Found by
  running the per-stage queues (each stage's next task runs once its
  predecessors are done) in O(tasks + edges); a cycle of waiting tasks is
  extracted only when every unfinished stage is stuck. So that one mistake is
  reported once, this run ignores the edges already reported as order
  violations and lets a missing task run as soon as its predecessors are done,
  on no stage.

The constraints are the table of edge rules ([Note: edge rules] in
schedlang.vocabulary.edges), :data:`EDGE_RULES` unless the caller passes
another. Tasks are numbered arithmetically (``kind, stage, microbatch, chunk``
in mixed radix, the kinds F, B and, split, W) and each number's predecessors
and successors translated from the table once per kind, stage and chunk, so
the check stays linear in tasks + edges and never builds the NetworkX graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from schedlang.lowering.graph import task_kinds
from schedlang.lowering.orders import stage_orders
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import OrderKind, Span, format_error
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import EDGE_RULES, Dependency, EdgeRule, EdgeRules
from schedlang.vocabulary.source_lines import MAX_SHOWN_DIAGNOSTICS, clip_text, more_diagnostics_line

MAX_SHOWN_DETAIL_LINES = 60  # a deadlock's cycle and step grid, per violation


class ViolationKind(str, Enum):
    MISSING_TASK = "missing_task"
    DUPLICATE_TASK = "duplicate_task"
    UNKNOWN_TASK = "unknown_task"
    ORDER_VIOLATION = "order_violation"
    DEADLOCK = "deadlock"


@dataclass(frozen=True)
class DeadlockWait:
    """One link of a deadlock cycle.

    Stage ``stage`` is stuck at ``stuck_task`` (its ``step``-th task), which
    needs its predecessor ``waits_for`` (through ``dependency``). That chain of
    waits ends at ``next_task``, which ``next_stage`` runs at ``next_step``,
    after the task it is itself stuck at. When ``waits_for`` is in no order,
    ``through_missing`` lists the missing tasks between it and ``next_task``
    (``waits_for`` first); otherwise ``waits_for`` is ``next_task``.
    """

    stage: int
    step: int
    stuck_task: TaskId
    waits_for: TaskId
    dependency: Dependency
    next_stage: int
    next_task: TaskId
    next_step: int
    through_missing: tuple[TaskId, ...] = ()


@dataclass(frozen=True)
class Violation:
    kind: ViolationKind
    tasks: tuple[TaskId, ...]
    message: str
    span: Span | None = None
    dependency: Dependency | None = None  # ORDER_VIOLATION: the Eq. 8 constraint broken
    cycle: tuple[DeadlockWait, ...] = ()  # DEADLOCK: the cycle, stage by stage
    details: tuple[str, ...] = ()  # lines printed under the message (DEADLOCK: cycle and grid)


@dataclass(frozen=True)
class LegalityReport:
    n_stages: int
    n_microbatches: int
    n_chunks: int
    violations: tuple[Violation, ...]
    split_backward: bool = False  # every (r, a, i) also has a W task

    @property
    def is_legal(self) -> bool:
        return not self.violations

    @property
    def n_tasks(self) -> int:
        return len(task_kinds(self.split_backward)) * self.n_stages * self.n_microbatches * self.n_chunks

    def of_kind(self, kind: ViolationKind) -> tuple[Violation, ...]:
        return tuple(violation for violation in self.violations if violation.kind is kind)

    def summary(self) -> str:
        dimensions = ", ".join(
            _plural(value, singular, plural)
            for value, singular, plural in (
                (self.n_stages, "stage", "stages"),
                (self.n_microbatches, "microbatch", "microbatches"),
                (self.n_chunks, "chunk", "chunks"),
                (self.n_tasks, "task", "tasks"),
            )
        )
        if self.is_legal:
            return f"legal: {dimensions}"
        count = len(self.violations)
        return f"illegal: {count} violation{'s' if count != 1 else ''} ({dimensions})"


def _plural(value: int, singular: str, plural: str) -> str:
    return f"{value} {singular if value == 1 else plural}"


class IllegalScheduleError(ValueError):
    """Raised by passes that need a legal schedule (the simulator) when given an illegal one."""

    def __init__(self, report: LegalityReport) -> None:
        super().__init__("; ".join(violation.message for violation in report.violations[:3]))
        self.report = report


@dataclass(frozen=True)
class _Dimensions:
    n_stages: int
    n_microbatches: int
    n_chunks: int
    split_backward: bool = False


class _TaskNumbering:
    """Tasks as integers: ``kind * PMN + stage * MN + microbatch * N + chunk``, the kinds numbered in the
    order of the rule table's ``task_kinds`` (F = 0, B = 1, and with a split backward W = 2).

    Each number's predecessors and successors are the rule table's ([Note: edge rules] in
    schedlang.vocabulary.edges), kept as differences of numbers (with the rule, for predecessors,
    whose messages name it). A rule shifts the stage and the chunk and never the microbatch, so whether a
    neighbour lies inside the graph depends only on a task's kind, stage and chunk: the table is asked once
    per such class, about its microbatch-0 task, and the M tasks of the class share the answer. That keeps
    the numbering linear in tasks + edges.
    """

    def __init__(self, dimensions: _Dimensions, rules: EdgeRules) -> None:
        n_stages, n_microbatches, n_chunks = dimensions.n_stages, dimensions.n_microbatches, dimensions.n_chunks
        self.n_stages = n_stages
        self.n_microbatches = n_microbatches
        self.n_chunks = n_chunks
        self.split_backward = dimensions.split_backward
        self.kinds = rules.task_kinds(dimensions.split_backward)
        self.per_stage = n_microbatches * n_chunks
        self.per_kind = n_stages * self.per_stage
        self.total = len(self.kinds) * self.per_kind
        self.predecessor_steps: list[tuple[tuple[int, EdgeRule], ...]] = []
        """Per number: where each predecessor is (its number minus this one) and the rule that links them."""
        self.successor_differences: list[tuple[int, ...]] = []
        """Per number: where each successor is (its number minus this one)."""
        split = dimensions.split_backward
        for kind in self.kinds:
            for stage in range(n_stages):
                predecessor_row, successor_row = [], []
                for chunk in range(n_chunks):
                    task = TaskId(kind, stage, 0, chunk)
                    predecessor_row.append(self._steps(task, rules.predecessors(task, n_stages, n_chunks, split)))
                    successors = self._steps(task, rules.successors(task, n_stages, n_chunks, split))
                    successor_row.append(tuple(difference for difference, _ in successors))
                self.predecessor_steps.extend(predecessor_row * n_microbatches)
                self.successor_differences.extend(successor_row * n_microbatches)

    def _steps(self, task: TaskId, neighbours: list[tuple[TaskId, EdgeRule]]) -> tuple[tuple[int, EdgeRule], ...]:
        number = self.number(task)
        return tuple((self.number(neighbour) - number, rule) for neighbour, rule in neighbours)

    def number(self, task: TaskId) -> int:
        """The number of a task of the graph (its kind among :attr:`kinds`; the caller checks)."""
        return (
            self.kinds.index(task.kind) * self.per_kind  # tuple.index compares by identity first: no Enum hashing
            + task.stage * self.per_stage
            + task.microbatch * self.n_chunks
            + task.chunk
        )

    def task(self, number: int) -> TaskId:
        kind, rest = divmod(number, self.per_kind)
        stage, rest = divmod(rest, self.per_stage)
        microbatch, chunk = divmod(rest, self.n_chunks)
        return TaskId(self.kinds[kind], stage, microbatch, chunk)

    def predecessors(self, number: int) -> list[tuple[int, EdgeRule]]:
        """The predecessors of task ``number`` and the rule that links each one, in table order."""
        return [(number + difference, rule) for difference, rule in self.predecessor_steps[number]]


_KIND_WORDS = {ActionKind.FORWARD: "forward", ActionKind.BACKWARD: "backward", ActionKind.WEIGHT: "weight gradients"}


def _describe(task: TaskId) -> str:
    return f"the {_KIND_WORDS[task.kind]} of microbatch {task.microbatch}, chunk {task.chunk}"


def _range_text(value: int, singular: str, plural: str) -> str:
    """``4 chunks (0 to 3)``, ``1 stage (only 0)``."""
    return f"{value} {plural} (0 to {value - 1})" if value > 1 else f"{value} {singular} (only 0)"


_OrderRow = tuple[int, list[TaskId], "list[Span | None] | None", "Span | None"]
"""One order as written: stage, tasks, each task's span (explicit orders only), the line's span."""

_StageSpans = list["list[Span | None] | None"]
"""Per stage, the span of each kept task, or None when the orders carry no spans."""


def _resolve(
    program_or_dims: ScheduleProgram | tuple[int, int, int],
    orders: Sequence[Sequence[TaskId]] | None,
    split_backward: bool | None,
) -> tuple[_Dimensions, list[_OrderRow], Span | None]:
    """Dimensions and the orders as ``(stage, tasks, token spans, line span)`` rows, in file order."""
    if isinstance(program_or_dims, ScheduleProgram):
        program = program_or_dims
        split = program.pipeline.split_backward
        if split_backward is not None and split_backward != split:
            raise ValueError(
                f"check_orders was asked for split_backward={split_backward}, but the program's "
                f"pipeline.split_backward is {split}; change the program instead"
            )
        dimensions = _Dimensions(program.n_stages, program.n_microbatches, program.n_chunks, split)
        order_span = program.spans.get("pipeline.order")
        if orders is None and program.pipeline.order is OrderKind.EXPLICIT:
            rows = [
                (
                    line.stage,
                    [token.task._replace(stage=line.stage) for token in line.tasks],
                    [token.span for token in line.tasks],
                    line.span,
                )
                for line in program.pipeline.explicit_orders
            ]
            return dimensions, rows, order_span
        if orders is None:
            orders = stage_orders(program)
    else:
        n_stages, n_microbatches, n_chunks = program_or_dims
        dimensions = _Dimensions(n_stages, n_microbatches, n_chunks, bool(split_backward))
        order_span = None
        if orders is None:
            raise ValueError("check_orders needs orders when given dimensions instead of a program")
    for name in ("n_stages", "n_microbatches", "n_chunks"):
        value = getattr(dimensions, name)
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return dimensions, [(stage, list(order), None, None) for stage, order in enumerate(orders)], order_span


def check_orders(
    program_or_dims: ScheduleProgram | tuple[int, int, int],
    orders: Sequence[Sequence[TaskId]] | None = None,
    *,
    split_backward: bool | None = None,
    rules: EdgeRules = EDGE_RULES,
) -> LegalityReport:
    """Check per-stage orders against Eq. 8 and for deadlock; see the module docstring.

    ``program_or_dims`` is a program or ``(n_stages, n_microbatches, n_chunks)``.
    ``orders`` defaults to the program's own orders; ``orders[r]`` is what stage
    ``r`` runs, first to last. ``split_backward`` says whether every task triple
    has a ``W`` task: a program's ``pipeline.split_backward`` (giving another
    value raises ValueError), False by default for dimensions. ``rules`` is the
    table of edge rules checked against ([Note: edge rules]).
    """
    dimensions, rows, order_span = _resolve(program_or_dims, orders, split_backward)
    numbering = _TaskNumbering(dimensions, rules)
    violations: list[Violation] = []

    kept_orders, kept_spans, line_spans = _keep_known_unique(dimensions, numbering, rows, violations)
    position = [-1] * numbering.total
    for order in kept_orders:
        for step, number in enumerate(order):
            position[number] = step

    for number in range(numbering.total):
        if position[number] == -1:
            task = numbering.task(number)
            violations.append(
                Violation(
                    ViolationKind.MISSING_TASK,
                    (task,),
                    f"stage {task.stage} never runs {task.local_form()} ({_describe(task)})",
                    line_spans[task.stage] or order_span,
                )
            )

    violated_edges = _check_stage_orders(numbering, kept_orders, kept_spans, position, violations)
    stuck = _run_queues(numbering, kept_orders, position, violated_edges).stuck_steps
    if stuck:
        violations.append(_deadlock(numbering, kept_orders, kept_spans, position, violated_edges, stuck))
    return LegalityReport(
        dimensions.n_stages,
        dimensions.n_microbatches,
        dimensions.n_chunks,
        tuple(violations),
        dimensions.split_backward,
    )


def _keep_known_unique(
    dimensions: _Dimensions,
    numbering: _TaskNumbering,
    rows: list[_OrderRow],
    violations: list[Violation],
) -> tuple[list[list[int]], _StageSpans, list[Span | None]]:
    """Drop unknown and repeated tasks, report each; return the kept orders."""
    n_stages, n_microbatches, n_chunks = dimensions.n_stages, dimensions.n_microbatches, dimensions.n_chunks
    kept_orders: list[list[int]] = [[] for _ in range(n_stages)]
    kept_spans: _StageSpans = [None] * n_stages
    line_spans: list[Span | None] = [None] * n_stages
    first_step: dict[int, int] = {}
    for stage, tasks, token_spans, line_span in rows:
        if not 0 <= stage < n_stages:
            if tasks or line_span is not None:
                violations.append(
                    Violation(
                        ViolationKind.UNKNOWN_TASK,
                        tuple(tasks),
                        f"stage {stage} does not exist: the pipeline has {_range_text(n_stages, 'stage', 'stages')}",
                        line_span,
                    )
                )
            continue
        if line_spans[stage] is None:
            line_spans[stage] = line_span
        kept = kept_orders[stage]
        if token_spans is not None and kept_spans[stage] is None:
            kept_spans[stage] = []
        spans_out = kept_spans[stage]
        for index, task in enumerate(tasks):
            span = None if token_spans is None else token_spans[index]
            problem = _unknown_reason(task, stage, n_microbatches, n_chunks, numbering.kinds)
            if problem is not None:
                violations.append(Violation(ViolationKind.UNKNOWN_TASK, (task,), problem, span))
                continue
            number = numbering.number(task)
            if number in first_step:
                violations.append(
                    Violation(
                        ViolationKind.DUPLICATE_TASK,
                        (task,),
                        f"stage {stage} runs {task.local_form()} twice (first at step {first_step[number]}); "
                        "remove one",
                        span,
                    )
                )
                continue
            first_step[number] = len(kept)
            kept.append(number)
            if spans_out is not None:
                spans_out.append(span)
    return kept_orders, kept_spans, line_spans


def _unknown_reason(
    task: TaskId, stage: int, n_microbatches: int, n_chunks: int, kinds: tuple[ActionKind, ...]
) -> str | None:
    if not isinstance(task, TaskId) or not isinstance(task.kind, ActionKind):
        raise TypeError(f"orders must hold TaskId values, got {task!r}")
    if task.kind not in kinds:  # the only kind a graph of the rule table can lack is the split backward's W
        return (
            f"stage {stage}: {task.local_form()} is a weight-gradient task ({_describe(task)}), but the "
            "backward is not split; set `split_backward = true` in the pipeline block, or drop the W tasks"
        )
    if not 0 <= task.microbatch < n_microbatches:
        return (
            f"stage {stage}: {task.local_form()} names microbatch {task.microbatch}, "
            f"but the pipeline has {_range_text(n_microbatches, 'microbatch', 'microbatches')}"
        )
    if not 0 <= task.chunk < n_chunks:
        return (
            f"stage {stage}: {task.local_form()} names chunk {task.chunk}, "
            f"but the sequence has {_range_text(n_chunks, 'chunk', 'chunks')}"
        )
    if task.stage != stage:
        return f"{task} is in the order of stage {stage} but belongs to stage {task.stage}"
    return None


def _check_stage_orders(
    numbering: _TaskNumbering,
    kept_orders: list[list[int]],
    kept_spans: _StageSpans,
    position: list[int],
    violations: list[Violation],
) -> set[int]:
    """Same-stage predecessors placed later; returns those edges as ``pred * total + succ``."""
    violated_edges: set[int] = set()
    total = numbering.total
    for stage, order in enumerate(kept_orders):
        spans = kept_spans[stage]
        for step, number in enumerate(order):
            for predecessor, rule in numbering.predecessors(number):
                if not rule.same_stage:
                    continue
                predecessor_step = position[predecessor]
                if predecessor_step <= step:
                    continue
                violated_edges.add(predecessor * total + number)
                task, before = numbering.task(number), numbering.task(predecessor)
                violations.append(
                    Violation(
                        ViolationKind.ORDER_VIOLATION,
                        (task, before),
                        f"stage {stage} runs {task.local_form()} (step {step}) before "
                        f"{before.local_form()} (step {predecessor_step}), but {rule.origin} requires "
                        f"{rule.formula}: {rule.reason}; move {task.local_form()} "
                        f"after {before.local_form()}",
                        None if spans is None else spans[step],
                        rule.dependency,
                    )
                )
    return violated_edges


@dataclass(frozen=True)
class QueueRun:
    """The outcome of running the per-stage queues to completion or deadlock."""

    completion_order: tuple[int, ...]  # task numbers in an order that respects every counted edge
    stuck_steps: tuple[int | None, ...] | None  # per stage, the step it is stuck at (None: finished)


def _run_queues(
    numbering: _TaskNumbering,
    kept_orders: list[list[int]],
    position: list[int],
    violated_edges: set[int],
) -> QueueRun:
    """The deadlock check's simulation: each stage runs its next task once its counted predecessors are done.

    A task not in any order (missing) runs, on no stage, as soon as its
    predecessors are done. Edges in ``violated_edges`` are not counted.
    """
    n_stages, total, successor_differences = numbering.n_stages, numbering.total, numbering.successor_differences
    waiting = list(map(len, numbering.predecessor_steps))
    for edge in violated_edges:
        waiting[edge % total] -= 1

    heads = [0] * n_stages
    owner = [-1] * total
    for stage, order in enumerate(kept_orders):
        for number in order:
            owner[number] = stage
    completion: list[int] = []
    ready_stages = list(range(n_stages))
    ready_floating = [number for number in range(total) if position[number] == -1 and waiting[number] == 0]

    def finish(number: int) -> None:
        completion.append(number)
        for difference in successor_differences[number]:
            successor = number + difference
            if violated_edges and number * total + successor in violated_edges:
                continue
            waiting[successor] -= 1
            if waiting[successor] == 0:
                successor_stage = owner[successor]
                if successor_stage == -1:
                    ready_floating.append(successor)
                elif kept_orders[successor_stage][heads[successor_stage]] == successor:
                    ready_stages.append(successor_stage)

    while ready_stages or ready_floating:
        while ready_floating:
            finish(ready_floating.pop())
        if not ready_stages:
            break
        stage = ready_stages.pop()
        order = kept_orders[stage]
        head = heads[stage]
        while head < len(order) and waiting[order[head]] == 0:
            heads[stage] = head + 1
            finish(order[head])
            head += 1
        heads[stage] = head
    stuck = tuple(None if heads[stage] == len(order) else heads[stage] for stage, order in enumerate(kept_orders))
    return QueueRun(tuple(completion), None if all(step is None for step in stuck) else stuck)


def execution_order(
    program_or_dims: ScheduleProgram | tuple[int, int, int],
    orders: Sequence[Sequence[TaskId]],
    *,
    split_backward: bool | None = None,
    rules: EdgeRules = EDGE_RULES,
) -> tuple[TaskId, ...]:
    """Every task in one global order that respects Eq. 8 (and ``B`` before ``W``) and each stage's order.

    The simulator processes tasks in this order. ``split_backward`` and
    ``rules`` as for :func:`check_orders`. Raises :class:`IllegalScheduleError`
    unless the orders are legal.
    """
    report = check_orders(program_or_dims, orders, split_backward=split_backward, rules=rules)
    if not report.is_legal:
        raise IllegalScheduleError(report)
    numbering = _TaskNumbering(
        _Dimensions(report.n_stages, report.n_microbatches, report.n_chunks, report.split_backward), rules
    )
    kept_orders = [[numbering.number(task) for task in order] for order in orders]
    position = [0] * numbering.total
    run = _run_queues(numbering, kept_orders, position, set())
    return tuple(numbering.task(number) for number in run.completion_order)


def _undone_predecessor(
    numbering: _TaskNumbering, number: int, done: list[bool], violated_edges: set[int]
) -> tuple[int, EdgeRule]:
    for predecessor, rule in numbering.predecessors(number):
        if violated_edges and predecessor * numbering.total + number in violated_edges:
            continue
        if not done[predecessor]:
            return predecessor, rule
    raise AssertionError(f"task {numbering.task(number)} is stuck but all its predecessors are done")


def _deadlock(
    numbering: _TaskNumbering,
    kept_orders: list[list[int]],
    kept_spans: _StageSpans,
    position: list[int],
    violated_edges: set[int],
    stuck: tuple[int | None, ...],
) -> Violation:
    """Extract the cycle of waiting tasks from the stuck state, stage by stage."""
    done = [False] * numbering.total
    for number in _run_queues(numbering, kept_orders, position, violated_edges).completion_order:
        done[number] = True
    owner = {number: stage for stage, order in enumerate(kept_orders) for number in order}
    first_stuck = next(stage for stage, step in enumerate(stuck) if step is not None)
    links: list[DeadlockWait] = []
    formulas: list[str] = []  # per link, the rule its stuck task waits by
    seen: dict[int, int] = {}
    stage = first_stuck
    while stage not in seen:
        seen[stage] = len(links)
        head = kept_orders[stage][stuck[stage]]
        direct, rule = _undone_predecessor(numbering, head, done, violated_edges)
        blocker, through = direct, []
        while blocker not in owner:
            through.append(numbering.task(blocker))
            blocker, _ = _undone_predecessor(numbering, blocker, done, violated_edges)
        links.append(
            DeadlockWait(
                stage,
                stuck[stage],
                numbering.task(head),
                numbering.task(direct),
                rule.dependency,
                owner[blocker],
                numbering.task(blocker),
                position[blocker],
                tuple(through),
            )
        )
        formulas.append(rule.formula)
        stage = owner[blocker]
    cycle = tuple(links[seen[stage] :])
    lines = [_describe_wait(link, formula) for link, formula in zip(cycle, formulas[seen[stage] :])]
    lines.append("")
    grid = format_step_grid([[numbering.task(number) for number in order] for order in kept_orders], stuck)
    lines.extend(grid.splitlines())
    lines.append(_deadlock_hint(cycle))
    start = cycle[0]
    spans = kept_spans[start.stage]
    stages_text = ", ".join(str(link.stage) for link in cycle)
    return Violation(
        ViolationKind.DEADLOCK,
        tuple(link.stuck_task for link in cycle),
        f"deadlock: stages {stages_text} wait for each other in a cycle, so none of them can run its next task",
        None if spans is None else spans[start.step],
        None,
        cycle,
        tuple(lines),
    )


def _deadlock_hint(cycle: tuple[DeadlockWait, ...]) -> str:
    """How to break the cycle at its first link: the stage that runs the awaited task late runs it earlier."""
    link = cycle[0]
    blocked = next(other for other in cycle if other.stage == link.next_stage)
    return (
        f"hint: stage {link.next_stage} must run {link.next_task} (step {link.next_step}) before its stuck "
        f"{blocked.stuck_task} (step {blocked.step}): move it earlier with the tasks it needs, or order stage "
        f"{link.stage} so that {link.stuck_task} comes after what stage {link.next_stage} can run first"
    )


def _describe_wait(link: DeadlockWait, formula: str) -> str:
    text = (
        f"stage {link.stage} is stuck at {link.stuck_task} (step {link.step}): it needs {link.waits_for} "
        f"({formula})"
    )
    for missing, needed in zip(link.through_missing, link.through_missing[1:] + (link.next_task,)):
        text += f"; {missing} is in no order and needs {needed}"
    return text + f"; stage {link.next_stage} runs {link.next_task} at step {link.next_step}, after its own stuck task"


def format_step_grid(
    orders: Sequence[Sequence[TaskId]],
    stuck_steps: Sequence[int | None],
    context: int = 3,
) -> str:
    """One column per stage, one row per step; ``<-- stuck`` marks where each stage waits.

    Like torch's ``_format_pipeline_order(..., error_step_number=...)``, but a
    deadlock leaves each stage stuck at its own step. Long orders show only the
    rows within ``context`` steps of a stuck step, with ``...`` for the gaps.
    """
    n_rows = max((len(order) for order in orders), default=0)
    marked = {stage: step for stage, step in enumerate(stuck_steps) if step is not None}
    if n_rows <= 4 * context + 8:
        rows = list(range(n_rows))
    else:
        wanted = {
            row
            for step in marked.values()
            for row in range(max(step - context, 0), min(step + context + 1, n_rows))
        }
        rows = sorted(wanted)
    cells = [
        [
            (str(orders[stage][row]) if row < len(orders[stage]) else "")
            + (" <-- stuck" if marked.get(stage) == row else "")
            for stage in range(len(orders))
        ]
        for row in rows
    ]
    headers = [f"Stage {stage}" for stage in range(len(orders))]
    widths = [
        max([len(headers[stage])] + [len(row_cells[stage]) for row_cells in cells]) for stage in range(len(orders))
    ]
    step_width = max(len("Step"), len(str(n_rows - 1)) if n_rows else 1)
    lines = ["Step".ljust(step_width) + "  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    previous = None
    for row, row_cells in zip(rows, cells):
        if previous is not None and row != previous + 1:
            lines.append("...")
        lines.append(
            str(row).ljust(step_width) + "  " + "  ".join(c.ljust(w) for c, w in zip(row_cells, widths)).rstrip()
        )
        previous = row
    return "\n".join(lines)


def render_report(
    report: LegalityReport,
    sources: Mapping[str, str] | None = None,
    format_diagnostic=None,
) -> str:
    """Violations as ``file:line:col: error: ...`` with source line and caret, then details: the first
    ``MAX_SHOWN_DIAGNOSTICS`` of them, each with at most ``MAX_SHOWN_DETAIL_LINES`` detail lines, then how many
    were left out (bounded as the front end's diagnostics are), then the summary with the total count.

    ``sources`` maps file names to their text. ``format_diagnostic(span,
    message, sources)`` replaces :func:`schedlang.lowering.report.format_error`
    when given (the front end can pass its own formatter).
    """
    formatter = format_diagnostic or format_error
    blocks = []
    for violation in report.violations[:MAX_SHOWN_DIAGNOSTICS]:
        text = formatter(violation.span, violation.message, sources)
        details = list(violation.details[:MAX_SHOWN_DETAIL_LINES])
        if len(violation.details) > MAX_SHOWN_DETAIL_LINES:
            details.append(f"... and {len(violation.details) - MAX_SHOWN_DETAIL_LINES} more lines not shown")
        if details:
            text += "\n" + "\n".join(f"  {clip_text(line)}" if line else "" for line in details)
        blocks.append(text)
    if len(report.violations) > MAX_SHOWN_DIAGNOSTICS:
        blocks.append(more_diagnostics_line(len(report.violations) - MAX_SHOWN_DIAGNOSTICS))
    blocks.append(report.summary())
    return "\n".join(blocks)
