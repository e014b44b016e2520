"""The checker's view of the capabilities list: every refusal of the runtime as a diagnostic at its key.

The rows themselves live in :mod:`schedlang.vocabulary.capabilities`, which the runtime consults too;
this module only states a checked schedule's :class:`~schedlang.vocabulary.RunRequest` and points each
refusal at the first of its keys the file writes, so a schedule ``check`` calls legal is one ``compile``
and the runtime accept.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedlang.diagnostics import Diagnostic
from schedlang.lowering.program import MeshSpec, ModelSpec, PipelineSpec, SequenceSpec, run_request
from schedlang.vocabulary import Span, refusals


def capability_diagnostics(
    model: ModelSpec | None,
    mesh: MeshSpec | None,
    sequence: SequenceSpec | None,
    pipeline: PipelineSpec | None,
    spans: Mapping[str, Span],
    fallback: Span,
) -> list[Diagnostic]:
    """One error per refusal of the runtime's capabilities list, at the first of its keys in ``spans``
    (``fallback`` when the file writes none); none while a block is still unreadable (``None``), whose own
    errors come first."""
    if None in (model, mesh, sequence, pipeline):
        return []
    diagnostics = []
    for refusal in refusals(run_request(model, mesh, sequence, pipeline)):
        span = next((spans[key] for key in refusal.keys if key in spans), fallback)
        diagnostics.append(Diagnostic.error(refusal.message, span))
    return diagnostics
