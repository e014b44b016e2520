"""Per-stage program orders: the sequence of tasks each pipeline stage runs.

The scheduling unit is one chunk of one microbatch, ``(microbatch, chunk)``;
units are numbered microbatch-major, ``(0, 0), (0, 1), ..., (1, 0), ...``, so
with one chunk per microbatch the orders are the classic full-sequence ones.

* GPipe: every forward in unit order, then every backward, microbatches in
  increasing order and, inside a microbatch, chunks from last to first (the
  state gradient flows from chunk ``i + 1`` to chunk ``i``, Eq. 8). Running
  the backwards in increasing microbatch order matches torch's
  ``ScheduleGPipe`` and frees the oldest activations first.
* 1F1B (StateFlow Figure 1b): stage ``r`` runs ``min(M N, N + P - r - 1)``
  forwards as warm-up (one whole microbatch plus the downstream pipeline
  delay, Eq. 13), then alternates one backward and one forward; when the
  forwards run out the remaining backwards follow. Backwards of a microbatch
  run from its last chunk to its first.

  [Note: extra warm-up] A stage's first backward waits for the last chunk of
  the first microbatch to go forward and backward through every stage below
  it, which with chunks takes several of this stage's chunk forwards, while
  1F1B's warm-up leaves it one. ``pipeline { extra_warmup = e }`` adds ``e``
  forwards to the warm-up (and the cool-down) of every stage but the last,
  whose first backward waits on nothing downstream; those stages hold ``e``
  more chunks of activations in flight. A list ``[e_0, ..., e_{P-1}]`` sets it
  per stage: the last entry is 0 and ``e_r <= e_{r-1} + 1``, since stage ``r``
  can run no more warm-up forwards than stage ``r - 1`` sends before it waits
  for its own first backward. The orders stay legal and deadlock free
  (tests/lowering check ranges of ``P, M, N, e`` and every such list up to 4
  stages).
* Explicit: the tasks as written in the schedule file, in the stage of their
  ``stage r:`` line.

[Note: split backward]
With ``pipeline { split_backward = true }`` (zero-bubble pipelining, Qi et al.
2023, applied to chunks) every unit also has a ``W`` task on every stage: the
weight gradients ``dW = dY^T X`` of the stage's linear layers, which nothing
waits for; ``B`` keeps what the previous stage and the previous chunk wait for
(input and state gradients, and the gradients of parameters outside linear
layers). ``W(r, a, i)`` depends only on ``B(r, a, i)``. The generated orders
put ``W`` right after its ``B``, except on stage ``r > 0`` for the backwards
whose gradient stage ``r - 1`` consumes in its cool-down (in 1F1B the last
``w_{r-1}`` units in backward order, ``w`` the warm-up count; in GPipe all):
those ``W`` tasks move to the end of the step, in backward order, so each such
gradient goes upstream one ``W`` sooner and stage ``r`` runs the deferred
``W`` tasks in the pipeline's drain. ``extra_deferred_weights = d`` defers the
``W`` of ``d`` more backwards on every stage ``r > 0`` (its last
``w_{r-1} + d``, all if fewer). The first stage's ``W`` stays after its ``B``.
A deferred chunk holds its linear layers' inputs and output gradients until
its ``W``: stage ``r > 0`` holds up to ``min(M N, w_{r-1} + d)`` chunks in
flight at its last forward (checked against the runtime's graph slots for
``P <= 4, M, N <= 4, e <= 2, d <= 5``). Sends are unchanged and ``W`` waits on
nothing of another stage, so the orders stay legal and deadlock free.

[Note: forward before weight gradients]
A send on NCCL is a kernel that stays on the sender's GPU until the receiver
posts the matching receive, and compute kernels beside it run slower. With
split backwards, stage ``r > 0`` would run ``B(j) W(j) F(k)`` while ``k``'s
activation has already been sent, so that send waits for all of ``W(j)``.
``pipeline { forward_before_weight = true }`` has every stage that receives
activations run ``B(j) F(k) W(j)`` instead (when there is a next forward; the
deferred ``W`` tasks stay at the end): the receive is posted as soon as the
gradient is out. ``B(k)`` starts when it did before, so gradients upstream
arrive as before; ``W`` still follows its ``B``, so the orders stay legal and
deadlock free, and no stage's most chunks in flight grows (tests/lowering
checks both for ranges of ``P, M, N, e``): a stage ``r > 0`` peaks at its last
forward either way.

The measurements behind these three rules are in docs/benchmarks.md,
"Measurements behind the pipeline orders".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import OrderKind
from schedlang.vocabulary.actions import TaskId

StageOrders = tuple[tuple[TaskId, ...], ...]
"""One tuple of tasks per stage, indexed by stage."""


def _forward_units(n_microbatches: int, n_chunks: int) -> list[tuple[int, int]]:
    return [(microbatch, chunk) for microbatch in range(n_microbatches) for chunk in range(n_chunks)]


def _backward_units(n_microbatches: int, n_chunks: int) -> list[tuple[int, int]]:
    return [
        (microbatch, chunk)
        for microbatch in range(n_microbatches)
        for chunk in reversed(range(n_chunks))
    ]


def _check_dimensions(n_stages: int, n_microbatches: int, n_chunks: int) -> None:
    for name, value in (("n_stages", n_stages), ("n_microbatches", n_microbatches), ("n_chunks", n_chunks)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


class _StageOrderBuilder:
    """One stage's order, with [Note: split backward]: ``W`` after its ``B``, held back to the end, or held
    until after the next forward ([Note: forward before weight gradients])."""

    def __init__(self, stage: int, split_backward: bool) -> None:
        self.stage = stage
        self.split_backward = split_backward
        self.tasks: list[TaskId] = []
        self.deferred: list[TaskId] = []
        self.held: list[TaskId] = []

    def forward(self, microbatch: int, chunk: int) -> None:
        self.tasks.append(TaskId.forward(self.stage, microbatch, chunk))
        self.tasks.extend(self.held)
        self.held.clear()

    def backward(
        self, microbatch: int, chunk: int, upstream_cool_down: bool, after_next_forward: bool = False
    ) -> None:
        """``upstream_cool_down``: stage ``r - 1`` consumes this backward's gradient in its cool-down;
        ``after_next_forward``: its ``W`` waits for the next forward (if it is not deferred to the end)."""
        self.tasks.append(TaskId.backward(self.stage, microbatch, chunk))
        if self.split_backward:
            weight = TaskId.weight(self.stage, microbatch, chunk)
            if upstream_cool_down and self.stage > 0:
                self.deferred.append(weight)
            else:
                (self.held if after_next_forward else self.tasks).append(weight)

    def order(self) -> tuple[TaskId, ...]:
        return tuple(self.tasks + self.held + self.deferred)


def gpipe_orders(n_stages: int, n_microbatches: int, n_chunks: int, split_backward: bool = False) -> StageOrders:
    """All forwards in unit order, then all backwards (microbatches in order, chunks reversed).

    With ``split_backward`` every backward is in the cool-down of every stage: see [Note: split backward].
    """
    _check_dimensions(n_stages, n_microbatches, n_chunks)
    orders = []
    for stage in range(n_stages):
        builder = _StageOrderBuilder(stage, split_backward)
        for microbatch, chunk in _forward_units(n_microbatches, n_chunks):
            builder.forward(microbatch, chunk)
        for microbatch, chunk in _backward_units(n_microbatches, n_chunks):
            builder.backward(microbatch, chunk, upstream_cool_down=True)
        orders.append(builder.order())
    return tuple(orders)


ExtraWarmup = Union[int, Sequence[int]]
"""[Note: extra warm-up]: one count for every stage but the last, or one per stage (the last 0)."""


def extra_warmup_counts(extra: ExtraWarmup, n_stages: int) -> tuple[int, ...]:
    """Each stage's extra warm-up forwards; raises ValueError for a malformed ``extra``."""
    if isinstance(extra, int):
        if extra < 0:
            raise ValueError(f"extra_warmup must be at least 0, got {extra}")
        return (extra,) * (n_stages - 1) + (0,)
    counts = tuple(extra)
    rises = any(later > earlier + 1 for earlier, later in zip(counts, counts[1:]))
    if len(counts) != n_stages or min(counts) < 0 or counts[-1] != 0 or rises:
        raise ValueError(
            f"a per-stage extra_warmup needs {n_stages} counts >= 0 ending in 0, each at most 1 more than the one "
            f"before, got {list(counts)}"
        )
    return counts


def one_f_one_b_warmup(
    n_stages: int, n_microbatches: int, n_chunks: int, stage: int, extra: ExtraWarmup = 0
) -> int:
    """Forwards stage ``stage`` runs before its first backward: ``min(MN, N + P - r - 1 + e_r)``.

    ``e_r`` is ``extra`` on every stage but the last (whose first backward waits on nothing downstream), or
    ``extra[r]`` for a per-stage list.
    """
    lookahead = extra_warmup_counts(extra, n_stages)[stage]
    return min(n_microbatches * n_chunks, n_chunks + n_stages - stage - 1 + lookahead)


def one_f_one_b_orders(
    n_stages: int,
    n_microbatches: int,
    n_chunks: int,
    extra_warmup: ExtraWarmup = 0,
    split_backward: bool = False,
    forward_before_weight: bool = False,
    extra_deferred_weights: int = 0,
) -> StageOrders:
    """StateFlow's chunk-level 1F1B: warm-up forwards, then one backward, one forward, ...

    ``extra_warmup`` forwards more before the first backward (not on the last stage), ``split_backward``
    ``W`` tasks, ``extra_deferred_weights`` more of them held to the end of the step and
    ``forward_before_weight`` their place on stages that receive activations: see the module docstring.
    """
    _check_dimensions(n_stages, n_microbatches, n_chunks)
    if extra_deferred_weights < 0:
        raise ValueError(f"extra_deferred_weights must be at least 0, got {extra_deferred_weights}")
    counts = extra_warmup_counts(extra_warmup, n_stages)
    forwards = _forward_units(n_microbatches, n_chunks)
    backwards = _backward_units(n_microbatches, n_chunks)
    warmups = [one_f_one_b_warmup(n_stages, n_microbatches, n_chunks, stage, counts) for stage in range(n_stages)]
    orders = []
    for stage, warmup in enumerate(warmups):
        builder = _StageOrderBuilder(stage, split_backward)
        # [Note: split backward]: the last w_{r-1} + extra_deferred_weights backwards defer their W
        upstream_cool_down_from = len(backwards) - (warmups[stage - 1] + extra_deferred_weights if stage > 0 else 0)
        for microbatch, chunk in forwards[:warmup]:
            builder.forward(microbatch, chunk)
        next_forward = warmup
        for index, (microbatch, chunk) in enumerate(backwards):
            builder.backward(
                microbatch,
                chunk,
                upstream_cool_down=index >= upstream_cool_down_from,
                after_next_forward=forward_before_weight and stage > 0 and next_forward < len(forwards),
            )
            if next_forward < len(forwards):
                builder.forward(*forwards[next_forward])
                next_forward += 1
        orders.append(builder.order())
    return tuple(orders)


def explicit_orders(program: ScheduleProgram) -> StageOrders:
    """The explicit ``stage r:`` lines as tasks, with each task's stage set to its line's.

    Several lines for one stage are concatenated in file order; a stage with no
    line gets an empty order (the legality pass reports its tasks as missing).
    Raises ``ValueError`` for a line naming a stage outside the pipeline: such
    a program has not passed the legality pass, which reports it with its span.
    """
    per_stage: list[list[TaskId]] = [[] for _ in range(program.n_stages)]
    for stage_order in program.pipeline.explicit_orders:
        if not 0 <= stage_order.stage < program.n_stages:
            raise ValueError(
                f"explicit order names stage {stage_order.stage} but the pipeline has "
                f"{program.n_stages} stages; run the legality pass first"
            )
        per_stage[stage_order.stage].extend(
            token.task._replace(stage=stage_order.stage) for token in stage_order.tasks
        )
    return tuple(tuple(order) for order in per_stage)


def stage_orders(program: ScheduleProgram) -> StageOrders:
    """The per-stage program orders the program's ``pipeline.order`` asks for."""
    kind = program.pipeline.order
    split = program.pipeline.split_backward
    if kind is OrderKind.GPIPE:
        return gpipe_orders(program.n_stages, program.n_microbatches, program.n_chunks, split)
    if kind is OrderKind.ONE_F_ONE_B:
        return one_f_one_b_orders(
            program.n_stages,
            program.n_microbatches,
            program.n_chunks,
            program.pipeline.extra_warmup,
            split,
            program.pipeline.forward_before_weight,
            program.pipeline.extra_deferred_weights,
        )
    if kind is OrderKind.EXPLICIT:
        return explicit_orders(program)
    raise ValueError(f"unknown pipeline order {kind!r}")
