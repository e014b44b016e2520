"""The ``pipeline`` block: the readers of ``extra_warmup`` and ``recompute``, and its spec.

Contract: :func:`read_extra_warmup` and :func:`read_recompute` follow ``schedlang.checks.readers``; how
the per-stage lists relate to the mesh and the order, which keys need ``split_backward``,
and the explicit ``stage r:`` lines are rules (``schedlang.checks.rules``,
``schedlang.checks.stages``). :func:`build_pipeline` is pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import read_choice, read_integer
from schedlang.lowering.program import PipelineSpec
from schedlang.vocabulary import Recompute, StageRecompute

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

MAX_MICROBATCHES = 1 << 20

PIPELINE_KEYS = (
    "pipeline.microbatches",
    "pipeline.order",
    "pipeline.microbatch_size",
    "pipeline.recompute",
    "pipeline.offload",
    "pipeline.cuda_graphs",
    "pipeline.extra_warmup",
    "pipeline.split_backward",
    "pipeline.forward_before_weight",
    "pipeline.extra_deferred_weights",
)


def read_extra_warmup(checker: Checker, value: ast.Value, path: str) -> int | tuple[int, ...] | None:
    """An integer (every stage but the last), or a list of counts, one per pipeline stage."""
    if not isinstance(value, ast.ListLiteral):
        return read_integer(checker, value, path, 0, MAX_MICROBATCHES)
    counts = [read_integer(checker, item, f"an entry of {path}", 0, MAX_MICROBATCHES) for item in value.items]
    return None if None in counts else tuple(counts)


def read_recompute(checker: Checker, value: ast.Value, path: str) -> StageRecompute | None:
    """A recompute mode for every stage, or a list of modes, one per pipeline stage (``recompute_per_stage``
    checks the count)."""
    if not isinstance(value, ast.ListLiteral):
        return read_choice(checker, value, path, Recompute, "recompute mode")
    if not value.items:
        checker.error(f"'{path}' lists no mode", value.span, hint="one mode per stage, e.g. recompute = [full, none]")
        return None
    modes = [read_choice(checker, item, f"an entry of {path}", Recompute, "recompute mode") for item in value.items]
    return None if None in modes else tuple(modes)


def build_pipeline(checker: Checker) -> PipelineSpec | None:
    """The spec, from the keys and the explicit orders the stage-line rule derived."""
    if not checker.valid(*PIPELINE_KEYS):
        return None
    explicit_orders = checker.derived.get("pipeline.explicit_orders")
    if explicit_orders is None:
        return None
    values = {path.split(".", 1)[1]: checker.get(path) for path in PIPELINE_KEYS}
    return PipelineSpec(explicit_orders=explicit_orders, **values)
