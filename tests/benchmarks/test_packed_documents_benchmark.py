"""benchmarks/packed_documents.py on the CPU: its chunk continues a document and cuts one every document length,
and run as a file with ``--device cpu --tiny`` it prints one table row per operator and document length, with
the pads the fused layout adds and the two calls agreeing. The timings themselves need a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.packed_documents import chunk_documents
from schedlang.kernels import CHUNK_SIZE

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_chunk_continues_a_document_and_cuts_one_every_document_length():
    documents = chunk_documents(1024, 256)
    assert documents.rows == 1 and documents.continues(0)
    lengths = [end - first for first, end in documents.pieces(0)]
    assert lengths == [128, 256, 256, 256, 128]


def test_tiny_run_on_the_cpu_prints_the_table(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "packed_documents.py"), "--device", "cpu", "--tiny"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = [line.strip("|").split("|") for line in completed.stdout.splitlines() if line.startswith("| g")]
    assert [(row[0].strip(), int(row[1])) for row in rows] == [("gla", 16), ("gla", 64), ("gdn", 16), ("gdn", 64)]
    for operator, document_length, pieces, pads, pieces_ms, fused_ms, _, layout_ms, difference in rows:
        lengths = [end - first for first, end in chunk_documents(128, int(document_length)).pieces(0)]
        slots = sum(-(-(length + 1) // CHUNK_SIZE) * CHUNK_SIZE for length in lengths[:-1]) + lengths[-1]
        assert int(pieces) == len(lengths) and int(pads.split()[0]) == slots - 128
        assert float(pieces_ms) > 0 and float(fused_ms) > 0 and float(layout_ms) > 0
        assert float(difference) < 1e-3, f"{operator}: fused and piece-by-piece differ by {difference} (bf16)"
