"""Programs built directly in Python, so lowering tests do not depend on the front end."""

from __future__ import annotations

from schedlang.lowering.program import (
    MeshSpec,
    PipelineSpec,
    ScheduleProgram,
    SequenceSpec,
    StageOrder,
    TaskToken,
)
from schedlang.vocabulary.actions import TaskId
from schedlang.vocabulary import LayerKind, ModelConfig, OrderKind, Span, TrainConfig


def make_program(
    n_stages: int,
    n_microbatches: int,
    n_chunks: int = 1,
    *,
    order: OrderKind = OrderKind.ONE_F_ONE_B,
    boundaries: tuple[int, ...] | None = None,
    layers: tuple[LayerKind, ...] | None = None,
    explicit_orders: tuple[StageOrder, ...] = (),
    mesh: MeshSpec | None = None,
    split_backward: bool = False,
    **sequence_options,
) -> ScheduleProgram:
    """A checked-looking program with uniform chunks of 64 tokens unless ``boundaries`` says otherwise."""
    if boundaries is None:
        boundaries = tuple(64 * chunk for chunk in range(n_chunks + 1))
    layers = layers or (LayerKind.GLA,) * n_stages
    per_stage = len(layers) // n_stages
    return ScheduleProgram(
        name="test",
        model=ModelConfig(vocab=256, d_model=128, layers=layers, heads=2, head_dim=64),
        mesh=mesh or MeshSpec(pipeline=n_stages),
        sequence=SequenceSpec(length=boundaries[-1], boundaries=boundaries, **sequence_options),
        pipeline=PipelineSpec(
            microbatches=n_microbatches, order=order, explicit_orders=explicit_orders, split_backward=split_backward
        ),
        train=TrainConfig(),
        stage_layers=tuple(tuple(range(stage * per_stage, (stage + 1) * per_stage)) for stage in range(n_stages)),
        source_file="test.sched",
    )


def explicit_program(
    n_stages: int,
    n_microbatches: int,
    n_chunks: int,
    lines: dict[int, str],
    first_line: int = 3,
    split_backward: bool = False,
):
    """An explicit-order program whose ``stage r:`` lines are given as text, with spans as the parser makes them.

    Returns the program and the source text its spans point into.
    """
    source_lines = ["schedule test", "pipeline {"]
    stage_orders = []
    for stage, text in lines.items():
        prefix = f"  stage {stage}: "
        line_number = len(source_lines) + 1
        tokens = []
        column = len(prefix) + 1
        for word in text.split():
            span = Span("test.sched", line_number, column, line_number, column + len(word))
            tokens.append(TaskToken(TaskId.parse(f"{stage}{word}"), span))
            column += len(word) + 1
        line_span = Span("test.sched", line_number, 3, line_number, len(prefix + text) + 1)
        stage_orders.append(StageOrder(stage, tuple(tokens), line_span))
        source_lines.append(prefix + text)
    source_lines.append("}")
    program = make_program(
        n_stages,
        n_microbatches,
        n_chunks,
        order=OrderKind.EXPLICIT,
        explicit_orders=tuple(stage_orders),
        split_backward=split_backward,
    )
    return program, "\n".join(source_lines) + "\n"
