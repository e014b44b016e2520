"""The padding rule (schedlang.runtime.document_padding) against the layout the runtime builds
(schedlang.runtime.packing.PaddedRows): a row's padded length, and the longest row a chunk of ``L`` tokens and at
most ``p`` pieces can have, which the memory and cost models size the recurrent operators by."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlang.runtime.document_padding import most_padded_tokens
from schedlang.runtime.packing import ChunkDocuments, PaddedRows

START = 100  # where the chunks start in their sequence: after position 0, so their first piece may continue


def chunk_of_rows(rows: list[list[int]]) -> ChunkDocuments:
    """A chunk whose rows hold pieces of these lengths (every row the same total), the first piece of each row
    continuing an earlier document."""
    length = sum(rows[0])
    inner = tuple(tuple(itertools.accumulate(row[:-1], initial=START))[1:] for row in rows)
    return ChunkDocuments(START, START + length, (START - 1,) * len(rows), inner)


def compositions(total: int, parts: int):
    """Every way of writing ``total`` as ``parts`` positive lengths, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [end - first for first, end in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("length", [1, 2, 5, 8, 11])
def test_the_bound_is_the_longest_row_the_runtime_lays_out(chunk_size, length):
    for pieces in range(1, length + 1):
        longest = max(
            PaddedRows.of(chunk_of_rows([row]), chunk_size).length for row in compositions(length, pieces)
        )
        assert most_padded_tokens(length, pieces, chunk_size) == longest, pieces
        assert longest <= length + (pieces - 1) * chunk_size


piece_lengths = st.lists(st.integers(1, 200), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(piece_lengths, min_size=1, max_size=4), st.sampled_from([1, 4, 16, 64]))
def test_no_row_the_runtime_lays_out_is_longer_than_the_bound(rows, chunk_size):
    length = max(sum(row) for row in rows)
    rows = [row[:-1] + [row[-1] + length - sum(row)] for row in rows]  # every row as long as the chunk
    padded = PaddedRows.of(chunk_of_rows(rows), chunk_size)
    pieces = max(len(row) for row in rows)
    assert padded.length <= most_padded_tokens(length, pieces, chunk_size)
    for row, starts in zip(rows, padded.piece_starts):  # each piece where the rows' length puts it
        assert starts[-1] + row[-1] <= padded.length
    # the bound is reached: leading pieces of whole kernel chunks and of one token, as its docstring says
    whole = min(pieces - 1, (length - pieces) // (chunk_size - 1)) if chunk_size > 1 else 0
    worst = [chunk_size] * whole + [1] * (pieces - 1 - whole)
    worst.append(length - sum(worst))
    assert PaddedRows.of(chunk_of_rows([worst]), chunk_size).length == most_padded_tokens(length, pieces, chunk_size)


def test_one_piece_is_not_padded():
    assert most_padded_tokens(300, 1, 64) == 300
    assert PaddedRows.of(chunk_of_rows([[300]]), 64).length == 300
