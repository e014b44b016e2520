"""benchmarks/graph_modes.py: its systems are the checked-in stage schedule revised to each CUDA-graph mode."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.graph_modes import STAGE_SCHEDULE, main, system_program
from benchmarks.pipeline_schedule import runtime_configs
from schedlang.vocabulary import CudaGraphs


@pytest.mark.parametrize("mode", ["false", "true", "step"])
def test_each_system_compiles_to_its_graph_mode(mode):
    args = argparse.Namespace(schedule=STAGE_SCHEDULE, length=256, microbatches=2, steps=3)
    configs = runtime_configs(system_program(args, 4, mode))
    assert configs.pipeline.cuda_graphs is CudaGraphs(mode)
    assert configs.pipeline.chunk_boundaries == (0, 64, 128, 192, 256) and configs.pipeline.microbatches == 2
    assert configs.train.steps == 3 and configs.model.d_model == 2048 and len(configs.model.layers) == 8


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--chunks", "2"])
    assert exited.value.code == 2
    assert "needs a GPU" in capsys.readouterr().err
