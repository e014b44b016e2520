"""The vocabulary every other package speaks: the base layer of schedlang.

Installed as ``schedlang.vocabulary``; it imports nothing of ours and nothing heavy (no torch, no Lark),
so the front end (``schedlang``), the lowering (``schedlang.lowering``), the runtime
(``schedlang.runtime``) and the kernels may all import it:

* :mod:`~schedlang.vocabulary.kinds`: the enums a schedule chooses among (layer kinds, optimizers, data
  sources, sequence-parallel methods and attention exchanges, recompute modes, dtypes, CUDA-graph modes,
  learning-rate schedules, pipeline orders, partitions, MLPs, GLA output gates, delta-rule gates);
* :mod:`~schedlang.vocabulary.model_options`, :mod:`~schedlang.vocabulary.model_settings` and
  :mod:`~schedlang.vocabulary.train_settings`: the one record family of a schedule's ``model`` and
  ``train`` settings, which the checker builds, the program holds, codegen writes out and the runtime reads;
* :mod:`~schedlang.vocabulary.source`: :class:`Span` and the one renderer of ``file:line:col: error:``
  messages with a caret;
* :mod:`~schedlang.vocabulary.actions`: the per-rank action IR placement emits and the executor runs;
* :mod:`~schedlang.vocabulary.capabilities`: the one list of what the runtime can run.
"""

from schedlang.vocabulary.actions import (
    Action,
    ActionKind,
    OffloadCopy,
    deferred_weight_units,
    next_backwards,
    offload_copies,
)
from schedlang.vocabulary.capabilities import (
    CAPABILITIES,
    Capability,
    Refusal,
    RunRequest,
    UnsupportedRunError,
    refusals,
    require_supported,
    run_request,
)
from schedlang.vocabulary.kinds import (
    AttentionExchange,
    CudaGraphs,
    DataKind,
    DeltaGates,
    DType,
    LayerKind,
    LearningRateScheduleKind,
    MlpKind,
    OptimizerKind,
    OrderKind,
    OutputGate,
    PartitionKind,
    Recompute,
    SequenceParallelMethod,
    StageRecompute,
    TokenFileDType,
    recompute_modes,
    recompute_on,
    recompute_text,
    stage_recompute,
)
from schedlang.vocabulary.model_options import (
    GATE_LOGIT_NORMALIZER,
    AttentionOptions,
    GdnOptions,
    GlaOptions,
    Mamba2Options,
    Mamba3Options,
    ModelOptions,
)
from schedlang.vocabulary.model_settings import (
    AttentionGeometry,
    ModelConfig,
    RecurrentStateGeometry,
    attention_geometry,
    recurrent_state_geometry,
)
from schedlang.vocabulary.source import Severity, Span, caret_line, format_error, render_message
from schedlang.vocabulary.train_settings import (
    DataConfig,
    LearningRateScheduleConfig,
    LossScaleConfig,
    OptimizerConfig,
    TrainConfig,
)

__all__ = [
    "Action",
    "ActionKind",
    "attention_geometry",
    "AttentionExchange",
    "AttentionGeometry",
    "AttentionOptions",
    "CAPABILITIES",
    "Capability",
    "caret_line",
    "CudaGraphs",
    "DataConfig",
    "DataKind",
    "deferred_weight_units",
    "DeltaGates",
    "DType",
    "format_error",
    "GATE_LOGIT_NORMALIZER",
    "GdnOptions",
    "GlaOptions",
    "LayerKind",
    "LearningRateScheduleConfig",
    "LearningRateScheduleKind",
    "LossScaleConfig",
    "Mamba2Options",
    "Mamba3Options",
    "MlpKind",
    "ModelConfig",
    "ModelOptions",
    "next_backwards",
    "offload_copies",
    "OffloadCopy",
    "OptimizerConfig",
    "OptimizerKind",
    "OrderKind",
    "OutputGate",
    "PartitionKind",
    "Recompute",
    "recompute_modes",
    "recompute_on",
    "recompute_text",
    "recurrent_state_geometry",
    "RecurrentStateGeometry",
    "Refusal",
    "refusals",
    "render_message",
    "require_supported",
    "run_request",
    "RunRequest",
    "SequenceParallelMethod",
    "Severity",
    "Span",
    "stage_recompute",
    "StageRecompute",
    "TokenFileDType",
    "TrainConfig",
    "UnsupportedRunError",
]
