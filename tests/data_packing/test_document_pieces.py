"""The statistic of packed data the models size the padding by (schedlang.runtime.data.most_document_pieces):
the most document pieces a chunk of each length can hold, on hand-checked files, against a brute-force count on
random ones, and against the chunks the runtime really draws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlang.runtime.data import TokenSource, most_document_pieces, most_occurrences
from schedlang.runtime.packing import DocumentLayout
from schedlang.vocabulary import DataConfig, DataKind

END = 9


def tokens_file(tmp_path, ids, dtype="<u2"):
    path = tmp_path / "ids.bin"
    np.asarray(ids, dtype=dtype).tofile(path)
    return str(path)


def pieces_of(path, lengths, validation=0.0, dtype="uint16"):
    config = DataConfig(DataKind.TOKENS, 0, path, dtype, validation=validation, document_end=END)
    return most_document_pieces(config, lengths)


def test_hand_checked_file(tmp_path):
    # ends at positions 3, 4 and 10: a chunk's first L - 1 tokens may hold them
    ids = [0, 0, 0, END, END, 0, 0, 0, 0, 0, END, 0, 0, 0, 0, 0]
    path = tokens_file(tmp_path, ids)
    # L = 1: no token before the last; L = 2: one end; L = 3: ends 3 and 4; L = 9: 3 .. 10 holds all three
    assert pieces_of(path, [1, 2, 3, 8, 9, 16]) == {1: 1, 2: 2, 3: 3, 8: 3, 9: 4, 16: 4}


def test_the_held_out_part_does_not_count(tmp_path):
    ids = [0] * 30 + [END] * 10  # every end in the last quarter
    path = tokens_file(tmp_path, ids)
    assert pieces_of(path, [8], validation=0.25) == {8: 1}
    assert pieces_of(path, [8]) == {8: 8}


def test_uint32_and_bytes_files(tmp_path):
    ids = [0, END, 70000, END, 0, END]
    assert pieces_of(tokens_file(tmp_path, ids, "<u4"), [4], dtype="uint32") == {4: 3}
    path = tokens_file(tmp_path, [0, END, 200, END, END, 0], "u1")
    assert most_document_pieces(DataConfig(DataKind.BYTES, 0, path, document_end=END), [3]) == {3: 3}


def test_no_documents_without_document_end_or_with_synthetic_data(tmp_path):
    path = tokens_file(tmp_path, [END] * 10)
    assert most_document_pieces(DataConfig(DataKind.TOKENS, 0, path, "uint16"), [4]) is None
    assert most_document_pieces(DataConfig(DataKind.SYNTHETIC), [4]) is None


def brute_force_most(ids: list[int], span: int) -> int:
    return max((sum(token == END for token in ids[start : start + span]) for start in range(len(ids) - span + 1)),
               default=0)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, END]), min_size=1, max_size=300),
    st.lists(st.integers(0, 40), min_size=1, max_size=4),
    st.integers(1, 50),
)
def test_blocks_count_as_a_python_loop_does(ids, spans, block):
    spans = [min(span, len(ids)) for span in spans]
    most = most_occurrences(np.asarray(ids, dtype=np.uint16), END, spans, len(ids), block)
    assert most == {span: brute_force_most(ids, span) for span in spans}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_chunk_the_runtime_draws_holds_more_pieces(tmp_path, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, END, 5000)
    ids[rng.random(5000) < 0.08] = END
    ids[2000:2040:2] = END  # a dense stretch
    path = tokens_file(tmp_path, ids)
    length, chunk = 128, 32
    most = pieces_of(path, [chunk])[chunk]
    source = TokenSource(DataConfig(DataKind.TOKENS, seed, path, "uint16", document_end=END), 16, length, 64)
    seen = 0
    for step in range(20):
        layout = DocumentLayout.of(source.global_batch_tokens(step), END)
        for start in range(0, length, chunk):
            documents = layout.chunk(0, 64, start, start + chunk)
            seen = max(seen, max(len(documents.pieces(row)) for row in range(documents.rows)))
    assert 1 < seen <= most
    assert most == 1 + brute_force_most(ids.tolist(), chunk - 1)
