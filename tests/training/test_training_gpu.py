"""On two GPUs (NCCL, the Triton kernels): an fp16 tied-embedding model on pipeline 2 with the default dynamic
loss scale trains like one GPU, and its two copies of the embedding stay bit-identical. Skipped without two
CUDA devices; the CPU tests (test_tied_embeddings.py, test_loss_scale.py) cover the same logic on gloo."""

from __future__ import annotations

import pytest
import torch

from training_harness import merged, run_training_job  # noqa: I001 (puts tests/runtime on the path first)
from test_tied_embeddings import schedule_text

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]
FP16_TOLERANCE = 1e-2  # the two copies' fp16 gradients are added in another order than one stage's


def test_an_fp16_tied_pipeline_on_two_gpus_trains_like_one(tmp_path):
    env = {"SCHEDLANG_TEST_DEVICE": "cuda"}
    texts = {
        "p2": schedule_text("p2", pipeline=2, dtype="fp16"),
        "one": schedule_text("one", dtype="fp16"),
    }
    pipelined = run_training_job({"p2": texts["p2"]}, 2, 3, tmp_path, env)["p2"]
    one = run_training_job({"one": texts["one"]}, 1, 3, tmp_path, env)["one"]
    for result in pipelined + one:
        assert [skipped for _, skipped in result["scales"]] == [False] * 3
    assert pipelined[0]["losses"] == pytest.approx(one[0]["losses"], rel=FP16_TOLERANCE)
    first, last = sorted(pipelined, key=lambda result: result["stage"])
    assert torch.equal(first["updated"]["embedding.weight"], last["updated"]["embedding.weight"])
    assert torch.equal(first["parameters"]["embedding.weight"], last["parameters"]["embedding.weight"])
    final, expected = merged(pipelined, "updated"), merged(one, "updated")
    assert sorted(final) == sorted(expected)
