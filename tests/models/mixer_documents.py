"""What every recurrent mixer with packed documents must do, checked on any ``mixer(hidden, state, documents=None)
-> (output, final_state)`` in float64: a chunk holding several documents equals each document's piece run alone
(the first from the incoming state when it continues, the others from zeros), and, as its negative control, a
start ignored changes the outputs after it."""

from __future__ import annotations

import torch

from schedlang.runtime.packing import ChunkDocuments


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The relative error of ``actual`` in float64; an empty pair (a one-tap convolution keeps no history) is 0."""
    if expected.numel() == 0:
        return 0.0 if actual.shape == expected.shape else float("inf")
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


def assert_documents_run_as_their_pieces(mixer, d_model: int) -> None:
    """Two rows of a 50-token chunk at position 100: the first continues a document from position 90 that restarts
    at 110 and 111; the second starts one at 100 and another at 130. The final state is each row's last piece's."""
    hidden = torch.randn(2, 50, d_model, dtype=torch.float64)
    _, incoming = mixer(torch.randn(2, 9, d_model, dtype=torch.float64), None)
    documents = ChunkDocuments(start=100, end=150, first_starts=(90, 100), inner_starts=((110, 111), (130,)))
    output, final = mixer(hidden, incoming, documents)
    for row in range(2):
        for first, end in documents.pieces(row):
            piece = hidden[row : row + 1, first - 100 : end - 100]
            state = incoming[row : row + 1] if first == 100 and documents.continues(row) else None
            alone, alone_final = mixer(piece, state)
            assert relative(output[row : row + 1, first - 100 : end - 100], alone) < 1e-10, (row, first)
        assert relative(final[row : row + 1], alone_final) < 1e-10, row


def assert_an_ignored_start_changes_what_follows(mixer, d_model: int) -> None:
    """The negative control of :func:`assert_documents_run_as_their_pieces`: the same tokens without the start at 12
    agree before it and differ after it."""
    hidden = torch.randn(1, 30, d_model, dtype=torch.float64)
    documents = ChunkDocuments(start=0, end=30, first_starts=(0,), inner_starts=((12,),))
    with_starts, _ = mixer(hidden, None, documents)
    without, _ = mixer(hidden, None)
    assert relative(with_starts[:, :12], without[:, :12]) < 1e-12
    assert relative(with_starts[:, 12:], without[:, 12:]) > 1e-3
