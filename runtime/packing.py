"""Packed documents: where documents start in a batch of token rows, and the layers' view of one chunk of it.

[Note: packed documents]
With ``data = tokens(..., document_end = e)`` (or ``bytes`` / ``text``) the token id ``e`` ends each
document and the token after it starts the next. Packed training equals training on each document alone:

* a document's tokens are the ones from its first token up to and including its ``document_end``; the
  sequence's first position starts a document (the model sees nothing before it, as without packing);
* every recurrent layer (gla, simple_gla, gdn, mamba2) reads a state that starts from zero at its document's first
  token, and the state crosses a chunk boundary as before when no document starts there
  (:func:`recurrent_by_document`, below);
* attention is block-causal: a query sees only the keys of its own document, in its chunk and in the earlier
  chunks' part of the sequence-wide buffers ([Note: documents in the K/V buffers] in
  :mod:`schedlang.runtime.kv_buffers`);
* the target that would cross a boundary (predicting the next document's first token from ``e``) carries no
  loss (:func:`loss_targets`), and a step's loss is divided by the number of targets in the *global* batch
  that carry one (:func:`loss_token_count`), so the sum over chunks, microbatches, stages and data replicas
  is the mean over those targets, and a document's gradient is the one it has alone.

Every rank computes the same layout from the same token window (:class:`DocumentLayout`, built on the host
from the replica's tokens once a step); a stage with no tokens of its own still reads the window. Attention
runs one pair of fused calls per document piece. Sequence parallelism and CUDA graphs do not take packed data
(``schedlang check`` refuses them), nor do gdn's short convolutions (their history of the last inputs would
cross a document start); mamba2's convolution masks its taps at document starts ([Note: short convolutions
over packed documents] in :mod:`schedlang.runtime.short_convolution`).

A recurrent layer makes ONE operator call per chunk however many documents start in it
(:func:`recurrent_by_document`): the chunk's pieces are laid out in one padded sequence per row
(:class:`PaddedRows`) and the kernel runs unchanged over it. A zero pad (q = k = v = 0, beta = 0, log-gate 0)
leaves the state as it is and its output is dropped; a *reset* token is a zero pad whose log-gate is
:data:`RESET_LOG_GATE`, so the state leaving it is exp(g) S = 0 exactly (the gate underflows) for gla's per-key
gate, simple_gla's per-head gate and gdn's S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.
Every piece of a row but its last is followed by zero pads and one reset token such that the reset token is the
last token of a kernel chunk (``schedlang.kernels.CHUNK_SIZE``): the next document then starts a fresh kernel
chunk, whose chunk-local cumulative gate starts at 0. A reset in the middle of a kernel chunk would be exact
in theory but would leave every later token of that chunk with a cumulative gate near -1e4, where float32's
spacing is about 1e-3, so the kernels' exp of differences of such numbers would carry relative errors near
1e-3. The last piece gets no reset (its final state is the row's), and shorter rows end in zero pads, which
the state passes unchanged. A row whose first
piece continues the previous chunk's document reads its row of the initial state, the others read zeros (the
state times a 0/1 row mask, so the dropped rows get the zero gradient they truly have).

Gradients are exact too: they flow back through the two index operations, and the pads contribute nothing.
A pad's gradient of its chunk-local cumulative gate is zero (its q and k are zero; the reset chunk's leaving
state is multiplied by exp(cumulative gate) = 0), so the reverse cumulative sum that turns those into gate
gradients gives each real token the gradient it has alone (``tests/data_packing/test_fused_documents.py``
checks this, and that no gradient is nan or inf, for each operator on both backends; the reset chunks take the
Triton GLA kernels' "steep" path, whose exponents are all <= 0, as the gdn kernels' are).

The cost of the padding: each piece but a row's last costs up to ``CHUNK_SIZE`` extra tokens (its pad and reset
token round it up to a multiple of the kernel chunk), so very short documents pay the most: a one-token document
costs a whole kernel chunk. The rule is :func:`schedlang.runtime.document_padding.padded_piece_tokens`, and
:func:`~schedlang.runtime.document_padding.most_padded_tokens` the longest row a chunk of so many pieces can have,
by which the memory and cost models size the operators. :func:`recurrent_piece_by_piece` is the reference the fused
call is tested against: one call per piece, each after the row's first from no state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from schedlang.kernels import CHUNK_SIZE
from schedlang.runtime.document_padding import padded_piece_tokens

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
"""``operator(initial_state, *per_token)``: ``[B, L, ...]`` tensors of one chunk (and a state ``[B, ...]`` or
None for zeros) in, ``(output [B, L, ...], final state [B, ...])`` out."""

RESET_LOG_GATE = -1.0e4
"""The log-gate of a reset token ([Note: packed documents]): exp of it is exactly 0 in float32 and float64 (also
once rounded to 16 bits), so the state leaving the token is zero. Finite, since -inf would make
the kernels' chunk-local cumulative gates produce inf - inf = nan."""


@dataclass(frozen=True)
class PaddedRows:
    """Where a chunk's tokens sit in the fused call's padded rows ([Note: packed documents]).

    ``piece_starts[row]``: the padded position of each of the row's pieces (:meth:`ChunkDocuments.pieces`), in
    order; ``resets[row]``: the row's reset tokens, one after each piece but the last, each the last token of a
    kernel chunk of ``chunk_size`` tokens, so the piece after it starts a kernel chunk; ``length``: the rows'
    common padded length (the longest row's; the other rows end in zero pads). Every other padded position
    is a zero pad.
    """

    chunk_size: int
    length: int
    piece_starts: tuple[tuple[int, ...], ...]
    resets: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(documents: ChunkDocuments, chunk_size: int) -> PaddedRows:
        """The layout of ``documents``: each piece but a row's last takes the smallest multiple of
        ``chunk_size`` tokens that holds it and its reset token, the reset token last
        (:func:`schedlang.runtime.document_padding.padded_piece_tokens`)."""
        piece_starts, resets, lengths = [], [], []
        for row in range(documents.rows):
            position, starts, row_resets = 0, [], []
            *leading, (last_first, last_end) = documents.pieces(row)
            for first, end in leading:
                starts.append(position)
                position += padded_piece_tokens(end - first, chunk_size)
                row_resets.append(position - 1)
            starts.append(position)
            lengths.append(position + last_end - last_first)
            piece_starts.append(tuple(starts))
            resets.append(tuple(row_resets))
        return PaddedRows(chunk_size, max(lengths), tuple(piece_starts), tuple(resets))

    def token_positions(self, documents: ChunkDocuments) -> torch.Tensor:
        """``[rows * (end - start)]``: the flat padded position (``row * length + p``) of each token of the
        chunk, row by row."""
        positions = [
            torch.arange(end - first) + (row * self.length + padded_start)
            for row in range(documents.rows)
            for (first, end), padded_start in zip(documents.pieces(row), self.piece_starts[row])
        ]
        return torch.cat(positions)

    def reset_positions(self) -> torch.Tensor:
        """The flat padded positions of the reset tokens."""
        return torch.tensor(
            [row * self.length + position for row, row_resets in enumerate(self.resets) for position in row_resets],
            dtype=torch.long,
        )


@dataclass(frozen=True)
class PaddedIndex:
    """:class:`PaddedRows` on a device: what the fused call gathers by. ``tokens``: the flat padded position of
    each token of the chunk (:meth:`PaddedRows.token_positions`); ``resets``: those of the reset tokens;
    ``continues``: ``[rows]``, 1 where the row's first piece reads the initial state, else 0."""

    rows: PaddedRows
    tokens: torch.Tensor
    resets: torch.Tensor
    continues: torch.Tensor

    def lay_out(self, tensor: torch.Tensor, log_gate: bool) -> torch.Tensor:
        """``[B, L, ...]`` -> ``[B, length, ...]``: each token at its padded position, zeros elsewhere, and
        :data:`RESET_LOG_GATE` at the reset tokens if ``tensor`` is the log-gate. Differentiable."""
        batch = tensor.shape[0]
        padded = tensor.new_zeros(batch * self.rows.length, *tensor.shape[2:])
        padded = padded.index_copy(0, self.tokens, tensor.flatten(0, 1))
        if log_gate:
            padded = padded.index_fill(0, self.resets, RESET_LOG_GATE)
        return padded.unflatten(0, (batch, self.rows.length))

    def take_back(self, padded: torch.Tensor, length: int) -> torch.Tensor:
        """``[B, length, ...]`` -> ``[B, L, ...]``: the chunk's tokens out of the padded rows. Differentiable."""
        return padded.flatten(0, 1).index_select(0, self.tokens).unflatten(0, (padded.shape[0], length))


@functools.lru_cache(maxsize=16)
def padded_index(documents: ChunkDocuments, chunk_size: int, device: torch.device) -> PaddedIndex:
    """The fused call's layout of ``documents`` (:meth:`PaddedRows.of`) on ``device``; built once per chunk, as
    every recurrent layer of the chunk asks for the same one."""
    rows = PaddedRows.of(documents, chunk_size)
    continues = torch.tensor([float(documents.continues(row)) for row in range(documents.rows)])
    return PaddedIndex(
        rows,
        rows.token_positions(documents).to(device),
        rows.reset_positions().to(device),
        continues.to(device),
    )


def recurrent_by_document(
    documents: ChunkDocuments | None,
    initial_state: torch.Tensor | None,
    operator: Operator,
    *per_token: torch.Tensor,
    log_gate: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``operator(initial_state, *per_token)`` with the state reset at every document start of ``documents``, in
    one operator call ([Note: packed documents]). ``per_token[log_gate]`` is the log-gate (a reset token's is
    :data:`RESET_LOG_GATE`); every per-token tensor is zero at pads.

    Without a reset in the chunk it is the one call it always was. Otherwise rows whose chunk starts a document
    read zeros instead of their initial state, and with a start inside the chunk the call runs over the padded
    rows of :class:`PaddedRows`, aligned to the kernels' chunks (``schedlang.kernels.CHUNK_SIZE``); the
    output is read back at the chunk's tokens and the final state is each row's last piece's. Equal, values and
    gradients, to :func:`recurrent_piece_by_piece`.
    """
    if documents is None or not documents.resets_state:
        return operator(initial_state, *per_token)
    index = padded_index(documents, CHUNK_SIZE, per_token[0].device)
    state = initial_state
    if initial_state is not None:
        state = initial_state * index.continues.to(initial_state.dtype).view(-1, *(1,) * (initial_state.dim() - 1))
    if not any(documents.inner_starts):
        return operator(state, *per_token)
    padded = (index.lay_out(tensor, position == log_gate) for position, tensor in enumerate(per_token))
    output, final_state = operator(state, *padded)
    return index.take_back(output, documents.end - documents.start), final_state


def recurrent_piece_by_piece(
    documents: ChunkDocuments | None,
    initial_state: torch.Tensor | None,
    operator: Operator,
    *per_token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference of :func:`recurrent_by_document`: ``operator(initial_state, *per_token)`` with the state
    reset at every document start of ``documents``, one operator call per document piece of each row.

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
