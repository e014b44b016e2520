"""The vocabulary every other package speaks: the base layer of schedlang.

Installed as ``schedlang.vocabulary``; it imports nothing of ours and nothing heavy (no torch, no Lark),
so the front end (``schedlang``), the lowering (``schedlang.lowering``), the runtime
(``schedlang.runtime``) and the kernels may all import it:

* :mod:`~schedlang.vocabulary.kinds`: the enums a schedule chooses among (layer kinds, optimizers, data
  sources, sequence-parallel methods and attention exchanges, recompute modes, dtypes, CUDA-graph modes,
  learning-rate schedules);
* :mod:`~schedlang.vocabulary.source`: :class:`Span` and the one renderer of ``file:line:col: error:``
  messages with a caret;
* :mod:`~schedlang.vocabulary.actions`: the per-rank action IR placement emits and the executor runs;
* :mod:`~schedlang.vocabulary.capabilities`: the one list of what the runtime can run.
"""

from schedlang.vocabulary.actions import Action, ActionKind, deferred_weight_units
from schedlang.vocabulary.capabilities import (
    CAPABILITIES,
    Capability,
    Refusal,
    RunRequest,
    UnsupportedRunError,
    refusals,
    require_supported,
)
from schedlang.vocabulary.kinds import (
    AttentionExchange,
    CudaGraphs,
    DataKind,
    DType,
    LayerKind,
    LearningRateScheduleKind,
    OptimizerKind,
    Recompute,
    SequenceParallelMethod,
    StageRecompute,
    TokenFileDType,
    recompute_modes,
    recompute_on,
    recompute_text,
    stage_recompute,
)
from schedlang.vocabulary.source import Severity, Span, caret_line, format_error, render_message

__all__ = [
    "AttentionExchange",
    "CAPABILITIES",
    "Action",
    "ActionKind",
    "Capability",
    "CudaGraphs",
    "DType",
    "DataKind",
    "LayerKind",
    "LearningRateScheduleKind",
    "OptimizerKind",
    "Recompute",
    "Refusal",
    "RunRequest",
    "SequenceParallelMethod",
    "Severity",
    "StageRecompute",
    "TokenFileDType",
    "Span",
    "UnsupportedRunError",
    "caret_line",
    "deferred_weight_units",
    "format_error",
    "recompute_modes",
    "recompute_on",
    "recompute_text",
    "refusals",
    "render_message",
    "require_supported",
    "stage_recompute",
]
