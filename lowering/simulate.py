"""The simulator: per-stage program orders plus a cost model give a :class:`Timeline`.

Contract. Input: a checked program and legal per-stage orders (default: the
program's own); illegal orders raise
:class:`~schedlang.lowering.legality.IllegalScheduleError` carrying the
legality report. Output: a timeline with one compute interval per task, one
message per Eq. 8 edge that carries data, each stage's gradient all-reduce, the
makespan and the peak live activations per stage.

Semantics. Each stage runs its tasks one at a time in program order; a task
starts when its stage is free and every predecessor has finished and its
message has arrived (``end + message_duration``). A ``W`` task (split
backward) is no different: it waits for its ``B`` on the same stage, with no
message. Messages never contend for
links. Messages with a nonzero duration also appear as ``SEND`` intervals on
the source's stage (``task`` = source) and ``RECV`` intervals on the
destination's stage (``task`` = destination), so a trace viewer shows them on
their own tracks; same-stage state hand-offs have zero duration. After its last
task each stage all-reduces its gradients over its sequence and data groups
(``CostModel.gradient_reduction_duration``; the runtime does not overlap it), and
the makespan is the latest stage's end of that.

Peak activations: the activations of chunk ``(a, i)`` on stage ``r`` are live
from the start of ``F(r, a, i)`` to the end of ``B(r, a, i)``, or of
``W(r, a, i)`` when the backward is split, since the linear layers' inputs and
output gradients are kept for it (half-open, so a release and an allocation
at the same instant do not overlap) and weigh ``s_i / T``; the peak is the
maximum over time of the live sum, in units of one whole microbatch (Eq. 12-13
without the boundary term ``B_r``). The generated split orders keep Eq. 13
([Note: split backward]).
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlang.lowering.cost import CostModel, CostModelKind, make_cost_model
from schedlang.lowering.graph import task_predecessors
from schedlang.lowering.legality import execution_order
from schedlang.lowering.orders import stage_orders
from schedlang.lowering.program import ScheduleProgram
from schedlang.lowering.timeline import MessageInterval, Stream, TaskInterval, Timeline
from schedlang.vocabulary.actions import ActionKind, TaskId
from schedlang.vocabulary.edges import EDGE_RULES

def simulate(
    program: ScheduleProgram,
    orders: Sequence[Sequence[TaskId]] | None = None,
    cost_model: CostModel | CostModelKind = CostModelKind.UNIT,
) -> Timeline:
    """Simulate ``orders`` (default: the program's) under ``cost_model``; see the module docstring."""
    if orders is None:
        orders = stage_orders(program)
    if isinstance(cost_model, CostModelKind):
        cost_model = make_cost_model(cost_model, program)
    sequence = execution_order(program, orders)
    n_stages, n_chunks = program.n_stages, program.n_chunks
    divisor = cost_model.time_divisor

    stage_free = [0] * n_stages
    start: dict[TaskId, float] = {}
    end: dict[TaskId, float] = {}
    messages: list[MessageInterval] = []
    transfers: list[TaskInterval] = []
    for task in sequence:
        ready = stage_free[task.stage]
        for predecessor, dependency in task_predecessors(task, n_stages, n_chunks):
            message_kind = dependency.payload  # the rule table's: [Note: edge rules]
            sent = end[predecessor]
            if not message_kind.moves:
                ready = max(ready, sent)
                continue
            arrived = sent + cost_model.message_duration(message_kind, predecessor, task)
            ready = max(ready, arrived)
            messages.append(
                MessageInterval(
                    message_kind,
                    predecessor,
                    task,
                    sent / divisor,
                    arrived / divisor,
                    cost_model.message_bytes(message_kind, predecessor, task),
                )
            )
            if arrived > sent:
                transfers.append(TaskInterval(predecessor, sent / divisor, arrived / divisor, Stream.SEND))
                transfers.append(TaskInterval(task, sent / divisor, arrived / divisor, Stream.RECV))
        start[task] = ready
        end[task] = ready + cost_model.task_duration(task)
        stage_free[task.stage] = end[task]

    compute = [TaskInterval(task, start[task] / divisor, end[task] / divisor) for task in sequence]
    # each stage all-reduces its gradients after its last task, not overlapped (Trainer.reduce_gradients)
    reductions = tuple(cost_model.gradient_reduction_duration(stage) / divisor for stage in range(n_stages))
    makespan = max((free / divisor + reduction for free, reduction in zip(stage_free, reductions)), default=0)
    return Timeline(
        n_stages=n_stages,
        tasks=tuple(compute + transfers),
        messages=tuple(messages),
        makespan=makespan,
        peak_activations=peak_activations(program, start, end),
        gradient_reductions=reductions,
    )


def peak_activations(
    program: ScheduleProgram,
    start: dict[TaskId, float],
    end: dict[TaskId, float],
) -> tuple[float, ...]:
    """Per stage, the most activation live at once, one whole microbatch = 1.0."""
    length = program.sequence.length
    releasing = EDGE_RULES.releasing_kind(program.pipeline.split_backward)
    events: list[list[tuple[float, int, int]]] = [[] for _ in range(program.n_stages)]
    for task, task_start in start.items():
        if task.kind is ActionKind.FORWARD:
            tokens = program.sequence.chunk_length(task.chunk)
            release = TaskId(releasing, task.stage, task.microbatch, task.chunk)
            # at equal times the release (flag 0) sorts before the allocation (flag 1): intervals are half-open
            events[task.stage].append((task_start, 1, tokens))
            events[task.stage].append((end[release], 0, -tokens))
    peaks = []
    for stage_events in events:
        live = peak = 0
        for _, _, change in sorted(stage_events):
            live += change
            peak = max(peak, live)
        peaks.append(peak / length)
    return tuple(peaks)
