"""Programs the exporter tests draw, built directly as the front end would hand them over."""

from __future__ import annotations

from schedlang.lowering.program import MeshSpec, PipelineSpec, ScheduleProgram, SequenceSpec
from schedlang.vocabulary import LayerKind, ModelConfig, OrderKind, TrainConfig


def tiny_program(
    order: str = "1f1b", n_chunks: int = 2, n_microbatches: int = 2, split_backward: bool = False
) -> ScheduleProgram:
    """A checked program of 2 stages x ``n_microbatches`` microbatches x ``n_chunks`` chunks, built directly."""
    length = 256
    return ScheduleProgram(
        name="tiny",
        model=ModelConfig(vocab=256, d_model=64, layers=(LayerKind.GLA, LayerKind.GLA), heads=2, head_dim=32),
        mesh=MeshSpec(pipeline=2),
        sequence=SequenceSpec(
            length=length,
            boundaries=tuple(length * chunk // n_chunks for chunk in range(n_chunks + 1)),
            kernel_chunk=64,
        ),
        pipeline=PipelineSpec(microbatches=n_microbatches, order=OrderKind(order), split_backward=split_backward),
        train=TrainConfig(),
        stage_layers=((0,), (1,)),
    )

