"""Packed documents through the real trainer: a tokens file of documents of random lengths, trained by the
generated script on 2 gloo pipeline ranks with 4 chunks and 2 microbatches, and on 2 data ranks, gives every
step's loss and every parameter gradient of one process running whole sequences, within 1e-5 (float32).
Each document starts from zero state and sees only its own keys on every stage, and the loss normaliser
(the global batch's targets that carry a loss) is the same on every rank. The same file without
``document_end`` gives other gradients."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from runtime_harness import assert_trains_like, relative_error, run_jobs  # noqa: E402

STEPS = 2
TOLERANCE = 1e-5
END = 63

SCHEDULE = """schedule {name}
model {{ vocab = 64  d_model = 32  layers = [gla, attn, gdn, simple_gla]  heads = 2  head_dim = 16  mlp = swiglu(ratio = 2) }}
mesh {{ pipeline = {pipeline}  data = {data} }}
sequence {{ length = 64  chunks = {chunks}  kernel_chunk = 16 }}
pipeline {{ microbatches = {microbatches}  microbatch_size = {size}  order = 1f1b }}
train {{ steps = {steps}  seed = 3  optimizer = adamw(lr = 1e-2)
  data = tokens(path = "{path}", seed = 5{document_end}) }}
"""


def write_documents(path: Path) -> None:
    """Documents of 3 to 40 tokens below END, each ended by END."""
    rng = np.random.default_rng(7)
    pieces = []
    while sum(map(len, pieces)) < 6000:
        pieces.append(np.append(rng.integers(0, END, rng.integers(2, 40)), END))
    np.concatenate(pieces).astype("<u2").tofile(path)


def schedule(name, path, pipeline=1, data=1, chunks=1, microbatches=1, size=4, packed=True) -> str:
    document_end = f", document_end = {END}" if packed else ""
    return SCHEDULE.format(
        name=name, pipeline=pipeline, data=data, chunks=chunks, microbatches=microbatches, size=size,
        steps=STEPS, path=path, document_end=document_end,
    )


@pytest.mark.slow
def test_packed_training_on_pipeline_and_data_ranks_equals_one_process(tmp_path):
    data = tmp_path / "documents.bin"
    write_documents(data)
    outcomes = run_jobs(
        {
            1: {"reference": schedule("reference", data), "unpacked": schedule("unpacked", data, packed=False)},
            2: {
                "pipeline": schedule("pipeline", data, pipeline=2, chunks=4, microbatches=2, size=2),
                "data": schedule("data", data, data=2, chunks=3, microbatches=2, size=1),
            },
        },
        tmp_path,
        STEPS,
    )
    assert_trains_like(outcomes["pipeline"], outcomes["reference"], STEPS, TOLERANCE)
    assert_trains_like(outcomes["data"], outcomes["reference"], STEPS, TOLERANCE)
    (_, reference), (_, unpacked) = outcomes["reference"], outcomes["unpacked"]
    assert max(relative_error(unpacked[name], reference[name]) for name in reference) > 1e-2
