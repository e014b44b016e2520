"""Rules relating ``train.data``'s packed documents to the mesh and the pipeline.

Contract: as every rule of ``schedlang.checks.rules`` (:data:`DATA_RULE_CHECKS` runs among them). Packed
documents ([Note: packed documents] in :mod:`schedlang.runtime.packing`) run on pipeline and data ranks,
chunked, recomputed and offloaded; not sequence-parallel (the state scans across a group know no document
starts) nor under CUDA graphs (a captured chunk replays one fixed set of operator calls, and packed chunks
split theirs where the documents start), nor with gdn's short convolutions (their history of the last inputs
is carried across a document start; resetting it there is not built). Whether ``document_end`` is an id of the vocabulary, or a token of
the tokenizer, is asked of the data with the file checks (:mod:`schedlang.preflight`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang.vocabulary import LayerKind

if TYPE_CHECKING:
    from schedlang.checks.context import Checker


def packed_documents_run_unsplit(checker: Checker) -> None:
    """``document_end`` with ``mesh.sequence > 1`` or ``pipeline.cuda_graphs``: an error at ``document_end``."""
    data = checker.get("train.data")
    if data is None or data.document_end is None:
        return
    span = checker.spans.get("train.data.document_end") or checker.span_of("train.data")
    sequence = checker.get("mesh.sequence")
    if sequence is not None and sequence > 1:
        checker.error(
            f"packed documents (document_end) do not run sequence-parallel, but mesh.sequence = {sequence}",
            span,
            hint="use mesh.pipeline or mesh.data ranks instead, or drop document_end",
        )
        checker.reject("train.data")
        return
    graphs = checker.get("pipeline.cuda_graphs")
    if graphs:
        checker.error(
            f"packed documents (document_end) do not run under CUDA graphs, but pipeline.cuda_graphs = {graphs.value}",
            span,
            hint="write `cuda_graphs = false`, or drop document_end",
        )
        checker.reject("train.data")


def packed_documents_without_short_convolutions(checker: Checker) -> None:
    """``document_end`` with gdn layers that have short convolutions: an error at ``document_end``."""
    data = checker.get("train.data")
    size, layers = checker.get("model.short_conv_size"), checker.get("model.layers")
    if data is None or data.document_end is None or size is None or not isinstance(layers, tuple):
        return
    if LayerKind.GDN not in layers:
        return
    checker.error(
        f"packed documents (document_end) reset the recurrent state at each document start, but the gdn layers' "
        f"short convolutions (short_conv_size = {size}) would still read the previous document's last inputs",
        checker.spans.get("train.data.document_end") or checker.span_of("train.data"),
        hint="drop document_end, or write short_conv_size = none",
    )
    checker.reject("train.data")


DATA_RULE_CHECKS = (
    (("train.data", "mesh.sequence", "pipeline.cuda_graphs"), packed_documents_run_unsplit),
    (("train.data", "model.short_conv_size", "model.layers"), packed_documents_without_short_convolutions),
)
