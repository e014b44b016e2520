"""Explicit ``stage r:`` lines: each stage's order, read token by token.

Contract: :func:`read_explicit_orders` checks the shape of the orders only: one
line per stage ``0 .. n_stages - 1``, every word of the form ``F<mb>.<chunk>``
(or ``B``, or ``W`` when the backward is split) with the microbatch and chunk in
range. Whether the orders are complete and legal is the legality pass's
question. Any of the counts may be ``None`` (its key was refused): the checks
that need it are skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.lowering.program import StageOrder, TaskToken
from schedlang.vocabulary.actions import Action, ActionKind

if TYPE_CHECKING:
    from schedlang.checks.context import Checker


def read_explicit_orders(
    checker: Checker,
    n_stages: int | None,
    microbatches: int | None,
    n_chunks: int | None,
    split_backward: bool | None,
) -> tuple[StageOrder, ...] | None:
    """The orders of ``checker.stage_lines``, one per stage in stage order; records ``pipeline.stage.R`` spans."""
    orders: dict[int, StageOrder] = {}
    first_line: dict[int, ast.StageLine] = {}
    ok = True
    for line in checker.stage_lines:
        stage = line.stage.value
        if stage < 0 or (n_stages is not None and stage >= n_stages):
            upper = f"0 to {n_stages - 1}" if n_stages is not None else ">= 0"
            checker.error(
                f"stage {stage} does not exist (stages are {upper}, mesh.pipeline = {n_stages})", line.stage.span
            )
            ok = False
            continue
        if stage in first_line:
            checker.error(
                f"stage {stage} has two order lines (first at line {first_line[stage].span.line})",
                line.stage.span,
                hint="give each stage exactly one `stage r:` line",
            )
            ok = False
            continue
        first_line[stage] = line
        checker.spans[f"pipeline.stage.{stage}"] = line.span
        tokens = []
        for word in line.tasks:
            token = _task_token(checker, word, stage, microbatches, n_chunks, split_backward)
            if token is None:
                ok = False
            else:
                tokens.append(token)
        orders[stage] = StageOrder(stage, tuple(tokens), line.span)
    if n_stages is not None:
        missing = [stage for stage in range(n_stages) if stage not in first_line]
        if missing:
            span = checker.spans.get("pipeline.order", checker.span_of("pipeline"))
            checker.error(
                f"order = explicit but no 'stage' line for stage{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}",
                span,
                hint=f"add `stage {missing[0]}: F0.0 ... B0.0`, one line per stage",
            )
            ok = False
    if not ok or n_stages is None:
        return None
    return tuple(orders[stage] for stage in range(n_stages))


def _task_token(
    checker: Checker,
    word: ast.StageTask,
    stage: int,
    microbatches: int | None,
    n_chunks: int | None,
    split_backward: bool | None,
) -> TaskToken | None:
    action = Action.read(word.text)  # the vocabulary's one parser of task and action text
    if action is None or not action.kind.is_compute:
        checker.error(
            f"'{word.text}' is not a task",
            word.span,
            hint="write tasks as F<microbatch>.<chunk>, B<microbatch>.<chunk> or W<microbatch>.<chunk>, e.g. F0.1",
        )
        return None
    kind, microbatch, chunk = action
    ok = True
    if kind is ActionKind.WEIGHT and split_backward is False:
        checker.error(
            f"task {word.text} is a weight-gradient task, but the backward is not split",
            word.span,
            hint="set `split_backward = true` in the pipeline block, or drop the W tasks",
        )
        ok = False
    if microbatches is not None and microbatch >= microbatches:
        checker.error(
            f"task {word.text} names microbatch {microbatch}, but pipeline.microbatches = {microbatches}",
            word.span,
            hint=f"microbatches are numbered 0 to {microbatches - 1}",
        )
        ok = False
    if n_chunks is not None and chunk >= n_chunks:
        checker.error(
            f"task {word.text} names chunk {chunk}, but the sequence has {n_chunks} chunk{'s' if n_chunks > 1 else ''}",
            word.span,
            hint=f"chunks are numbered 0 to {n_chunks - 1}",
        )
        ok = False
    if not ok:
        return None
    return TaskToken(action.on(stage), word.span)
