"""The checker's view of the capabilities list: every refusal of the runtime as a diagnostic at its key.

The rows themselves live in :mod:`schedlang.vocabulary.capabilities`, which the runtime consults too;
this module only states a checked schedule's :class:`~schedlang.vocabulary.RunRequest` and points each
refusal at the first of its keys the file writes, so a schedule ``check`` calls legal is one ``compile``
and the runtime accept.
"""

from __future__ import annotations

from schedlang.diagnostics import Diagnostic
from schedlang.lowering.program import ScheduleProgram
from schedlang.vocabulary import Span, refusals, run_request


def capability_diagnostics(program: ScheduleProgram, fallback: Span) -> list[Diagnostic]:
    """One error per refusal of the runtime's capabilities list, at the first of its keys in the program's
    spans (``fallback`` when the file writes none)."""
    diagnostics = []
    for refusal in refusals(run_request(program.model, program)):
        span = next((program.spans[key] for key in refusal.keys if key in program.spans), fallback)
        diagnostics.append(Diagnostic.error(refusal.message, span))
    return diagnostics
