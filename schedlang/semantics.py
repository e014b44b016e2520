"""Syntax tree to checked program: the semantic pass of the front end.

Contract: :func:`lower_to_program` takes any :class:`schedlang.ast.ScheduleFile`
the parser produced. It checks every block, key and value (names, types,
ranges, divisibility, chunk boundaries, the stage-to-layer assignment, the
shape of explicit ``stage r:`` lines), collects every problem, and either
raises one :class:`~schedlang.diagnostics.ScheduleError` listing them all in
file order (with what the errors leave checkable: schedlang.checks.partial)
or returns a :class:`~schedlang.lowering.program.ScheduleProgram`
satisfying [Note: program contract], with ``spans`` holding where each key was
written (``"pipeline.order"``, ``"train.optimizer.lr"``, ``"pipeline.stage.1"``).

The checks live in ``schedlang.checks``: the keys are sorted against the key
schema, each key is read through its schema row when first needed, the
cross-key rules run in their listed order, and each block's record is built from
what was read. Explicit orders are only checked token by token here (form
``F<mb>.<chunk>``, microbatch and chunk in range, one line per stage); whether
they are complete and legal is the legality pass's question.
"""

from __future__ import annotations

from schedlang import ast
from schedlang.capabilities import capability_diagnostics
from schedlang.checks.collect import collect_keys
from schedlang.checks.context import Checker
from schedlang.checks.mesh import build_mesh
from schedlang.checks.partial import partial_program
from schedlang.checks.pipeline import build_pipeline
from schedlang.checks.records import build_model, build_train
from schedlang.checks.rules import RULES
from schedlang.checks.schema import BLOCK_KEYS
from schedlang.checks.sequence import build_sequence
from schedlang.diagnostics import ScheduleError
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import TrainConfig

__all__ = ["BLOCK_KEYS", "lower_to_program"]


def lower_to_program(schedule_file: ast.ScheduleFile, source_text: str) -> ScheduleProgram:
    """Check ``schedule_file`` and lower it; see the module docstring for the contract."""
    checker = Checker(schedule_file, source_text)
    collect_keys(checker)
    for rule in RULES:
        rule.check(checker)
    model = build_model(checker)
    mesh = build_mesh(checker)
    sequence = build_sequence(checker)
    pipeline = build_pipeline(checker)
    train = build_train(checker)
    stage_layers = checker.derived["model.stages"]
    program = None
    if None not in (model, mesh, sequence, pipeline):
        # The capabilities read the model, mesh, sequence and pipeline of the program; they are checked as soon
        # as those read cleanly, beside the problems of the other keys. A program with a refused train block,
        # stage list or header (each reported) is only checked, never returned.
        program = ScheduleProgram(
            name=schedule_file.header.name if schedule_file.header is not None else "",
            model=model,
            mesh=mesh,
            sequence=sequence,
            pipeline=pipeline,
            train=train or TrainConfig(),
            stage_layers=stage_layers or (),
            source_file=checker.filename,
            spans=dict(checker.spans),
        )
        checker.diagnostics.extend(capability_diagnostics(program, checker.file_start()))
    if checker.diagnostics:
        # before sorting: a key read first by partial_program reports its problems too
        name = schedule_file.header.name if schedule_file.header is not None else "schedule"
        partial = partial_program(checker, name, model, mesh, sequence, pipeline, train)
        ordered = sorted(checker.diagnostics, key=lambda diagnostic: (diagnostic.span.line, diagnostic.span.column))
        raise ScheduleError(ordered, {checker.filename: source_text}, partial)
    if program is None or None in (train, stage_layers):
        raise RuntimeError("semantic pass left a value unset without reporting why")
    return program
