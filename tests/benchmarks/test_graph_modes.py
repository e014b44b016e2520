"""benchmarks/graph_modes.py: its systems are schedules the checker accepts, one per CUDA-graph mode."""

from __future__ import annotations

import pytest
import torch

from benchmarks.graph_modes import SCHEDULE, main
from benchmarks.pipeline_schedule import compile_schedule_text
from schedlang.vocabulary import CudaGraphs


@pytest.mark.parametrize("mode", ["false", "true", "step"])
def test_each_system_compiles_to_its_graph_mode(mode):
    text = SCHEDULE.format(
        vocab=64, d_model=32, layers=2, heads=2, head_dim=16, length=256, chunks=4, microbatches=2, graphs=mode,
        steps=3, dtype="bf16",
    )
    configs = compile_schedule_text(text)
    assert configs.pipeline.cuda_graphs is CudaGraphs(mode)
    assert len(configs.pipeline.chunk_boundaries) == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--chunks", "2"])
    assert exited.value.code == 2
    assert "needs a GPU" in capsys.readouterr().err
