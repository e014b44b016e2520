"""Packed documents: where documents start in a batch of token rows, and the layers' view of one chunk of it.

[Note: packed documents]
With ``data = tokens(..., document_end = e)`` (or ``bytes`` / ``text``) the token id ``e`` ends each
document and the token after it starts the next. Packed training equals training on each document alone:

* a document's tokens are the ones from its first token up to and including its ``document_end``; the
  sequence's first position starts a document (the model sees nothing before it, as without packing);
* every recurrent layer (gla, simple_gla, gdn) reads a state that starts from zero at its document's first
  token: the operator call is split, per batch row, at the document starts inside the chunk, each piece after
  a start beginning from no initial state (the kernels' ``initial_state=None``, zeros), and the state crosses
  a chunk boundary as before when no document starts there (:func:`recurrent_by_document`);
* attention is block-causal: a query sees only the keys of its own document, in its chunk and in the earlier
  chunks' part of the sequence-wide buffers ([Note: documents in the K/V buffers] in
  :mod:`schedlang.runtime.kv_buffers`);
* the target that would cross a boundary (predicting the next document's first token from ``e``) carries no
  loss (:func:`loss_targets`), and a step's loss is divided by the number of targets in the *global* batch
  that carry one (:func:`loss_token_count`), so the sum over chunks, microbatches, stages and data replicas
  is the mean over those targets, and a document's gradient is the one it has alone.

Every rank computes the same layout from the same token window (:class:`DocumentLayout`, built on the host
from the replica's tokens once a step); a stage with no tokens of its own still reads the window. This is
exact and simple: a recurrent layer runs one operator call per document piece of each row that holds a
start, and attention one pair of fused calls per document piece. A fused variable-length kernel (one call
over a flat batch of pieces) is later work. Sequence parallelism and CUDA graphs do not take packed data
(``schedlang check`` refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

IGNORED_TARGET = -100
"""The target id ``torch.nn.functional.cross_entropy`` skips (its default ``ignore_index``)."""


def loss_targets(inputs: torch.Tensor, targets: torch.Tensor, document_end: int | None) -> torch.Tensor:
    """``targets`` with :data:`IGNORED_TARGET` where the input is ``document_end`` (the target is then the
    next document's first token); ``targets`` itself without packing."""
    if document_end is None:
        return targets
    return targets.masked_fill(inputs == document_end, IGNORED_TARGET)


def loss_token_count(tokens: torch.Tensor, document_end: int | None) -> int:
    """How many targets of ``tokens`` (``[rows, length + 1]``: inputs and shifted targets) carry loss."""
    inputs = tokens[:, :-1]
    if document_end is None:
        return inputs.numel()
    return int(inputs.numel() - (inputs == document_end).sum())


@dataclass(frozen=True)
class ChunkDocuments:
    """The documents one chunk of a microbatch's rows holds: the chunk is positions ``start .. end - 1``.

    ``first_starts[row]``: where the document holding position ``start`` starts (``<= start``);
    ``inner_starts[row]``: the positions in ``start + 1 .. end - 1`` where a document starts, ascending.
    """

    start: int
    end: int
    first_starts: tuple[int, ...]
    inner_starts: tuple[tuple[int, ...], ...]

    @property
    def rows(self) -> int:
        return len(self.first_starts)

    def continues(self, row: int) -> bool:
        """Whether the row's first token reads the state the previous chunk left (its document started before)."""
        return self.first_starts[row] < self.start

    def pieces(self, row: int) -> tuple[tuple[int, int], ...]:
        """The row's document pieces in the chunk, as absolute ``(first, end)`` positions, in order."""
        bounds = (self.start, *self.inner_starts[row], self.end)
        return tuple(zip(bounds, bounds[1:]))

    @property
    def resets_state(self) -> bool:
        """Whether some row starts a document inside the chunk or at its start (not at the sequence's start,
        where there is no state yet)."""
        return any(self.inner_starts) or (self.start > 0 and not all(map(self.continues, range(self.rows))))

    @property
    def masks_keys(self) -> bool:
        """Whether some query does not see every earlier key: a document starts after position 0."""
        return any(self.inner_starts) or any(self.first_starts)

    def segment_ids(self) -> torch.Tensor:
        """``[rows, end - start]``: for each position of the chunk, where its document starts."""
        ids = torch.empty(self.rows, self.end - self.start, dtype=torch.long)
        for row in range(self.rows):
            for first, end in self.pieces(row):
                ids[row, first - self.start : end - self.start] = first
        return ids


def block_causal_mask(documents: ChunkDocuments, device: torch.device) -> torch.Tensor:
    """``[rows, 1, L, L]``, True where a query may see a key: causal, and in its own document; for a chunk that
    is the whole sequence (``start`` 0), the unchunked attention's mask."""
    if documents.start != 0:
        raise ValueError("a block-causal mask is for the whole sequence; chunks attend through the K/V buffers")
    ids = documents.segment_ids().to(device)
    same = ids[:, None, :, None] == ids[:, None, None, :]
    return same & torch.ones(documents.end, documents.end, dtype=torch.bool, device=device).tril()


@dataclass(frozen=True)
class DocumentLayout:
    """Where documents start in a batch of token rows: ``starts[row]``, ascending positions ``p`` in
    ``1 .. length - 1`` whose previous token is ``document_end`` (position 0 always starts one)."""

    starts: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(tokens: torch.Tensor, document_end: int) -> DocumentLayout:
        """The layout of ``tokens`` ``[rows, length + 1]`` (inputs and shifted targets)."""
        ends = (tokens[:, :-2] == document_end).cpu()
        return DocumentLayout(tuple(tuple(int(p) + 1 for p in torch.nonzero(row).flatten()) for row in ends))

    def chunk(self, first_row: int, rows: int, start: int, end: int) -> ChunkDocuments:
        """The documents of rows ``first_row ..`` (``rows`` of them) in positions ``start .. end - 1``."""
        first_starts, inner_starts = [], []
        for starts in self.starts[first_row : first_row + rows]:
            first_starts.append(max((p for p in starts if p <= start), default=0))
            inner_starts.append(tuple(p for p in starts if start < p < end))
        return ChunkDocuments(start, end, tuple(first_starts), tuple(inner_starts))


Operator = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def recurrent_by_document(
    documents: ChunkDocuments | None,
    initial_state: torch.Tensor | None,
    operator: Operator,
    *per_token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``operator(initial_state, *per_token)`` (``[B, L, ...]`` tensors of one chunk in, ``(output [B, L, ...],
    final state [B, ...])`` out) with the state reset at every document start of ``documents``.

    Without a reset in the chunk it is the one call it always was. Otherwise each row runs piece by piece: the
    first piece from the row's initial state when its document continues from the previous chunk, every
    other piece from none; the row's final state is its last piece's.
    """
    if documents is None or not documents.resets_state:
        return operator(initial_state, *per_token)
    outputs, final_states = [], []
    for row in range(documents.rows):
        state = initial_state[row : row + 1] if initial_state is not None and documents.continues(row) else None
        pieces = []
        for index, (first, end) in enumerate(documents.pieces(row)):
            local = slice(first - documents.start, end - documents.start)
            state = state if index == 0 else None  # every later piece starts a document
            output, state = operator(state, *(tensor[row : row + 1, local] for tensor in per_token))
            pieces.append(output)
        outputs.append(torch.cat(pieces, dim=1))
        final_states.append(state)
    return torch.cat(outputs, dim=0), torch.cat(final_states, dim=0)
