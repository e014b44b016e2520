"""What a checkpoint records about the run that wrote it, and the comparison on resume.

Each checkpoint stores, next to the model and optimizer state and through
torch.distributed.checkpoint itself (one more entry of the saved state dict,
under ``run``), the model, the mesh and the parts of the schedule that decide
which tensors exist and what they mean. On resume the recorded values are
compared key by key with the schedule being run: a checkpoint of a 2-layer
model does not load into a 1-layer one, nor 1 x 16 heads into 2 x 8.
"""

from __future__ import annotations

import dataclasses

from schedlang.runtime.config import PipelineConfig
from schedlang.vocabulary import ModelConfig, ModelOptions, TrainConfig

RUN_RECORD_KEY = "run"


def run_record(
    model: ModelConfig, pipeline: PipelineConfig, train: TrainConfig, mesh_shape: tuple[int, int, int]
) -> dict[str, str]:
    """``{schedule key: value as text}``; the keys are those a user edits in the ``.sched`` file."""
    values = {
        "model.vocab": model.vocab,
        "model.d_model": model.d_model,
        "model.layers": tuple(kind.value for kind in model.layers),
        "model.heads": model.heads,
        "model.head_dim": model.head_dim,
        "model.mlp_ratio": float(model.mlp_ratio),
        "mesh": tuple(mesh_shape),
        "pipeline.stage_layers": tuple(tuple(layers) for layers in pipeline.stage_layers),
        "pipeline.microbatches": pipeline.microbatches,
        "pipeline.microbatch_size": pipeline.microbatch_size,
        "sequence.chunks": tuple(pipeline.chunk_boundaries),
        "train.optimizer": train.optimizer.kind.value,
        "train.dtype": train.dtype,
    }
    values.update(architecture_entries(model))
    return {key: repr(value) for key, value in values.items()}


def architecture_entries(model: ModelConfig) -> dict[str, object]:
    """``model.norm_eps`` and ``model.options`` (flash-linear-attention's GLA, docs/models.md), recorded only
    when either differs from its default, so that the records of earlier checkpoints still match."""
    default_eps = next(field.default for field in dataclasses.fields(ModelConfig) if field.name == "norm_eps")
    options = model.options.architecture_record()
    if model.norm_eps == default_eps and options == ModelOptions().architecture_record():
        return {}
    return {"model.norm_eps": float(model.norm_eps), "model.options": options}


def first_mismatch(recorded: dict[str, str], expected: dict[str, str]) -> tuple[str, str, str] | None:
    """``(key, recorded value, expected value)`` of the first key that differs, in ``expected``'s order."""
    for key, value in expected.items():
        if recorded.get(key) != value:
            return key, recorded.get(key, "nothing"), value
    return None
