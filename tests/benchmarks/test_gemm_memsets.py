"""benchmarks/gemm_memsets.py replays the linear layers of a GLA block: they must be the runtime model's."""

import torch

from benchmarks.gemm_memsets import block_linears
from schedlang.runtime.linear import Linear
from schedlang.runtime.model import build_stage_model, swiglu_width
from schedlang.vocabulary import LayerKind, ModelConfig


def test_the_benchmark_replays_the_linear_layers_of_a_runtime_gla_block():
    config = ModelConfig(vocab=32, d_model=64, layers=(LayerKind.GLA,), heads=2, head_dim=32, mlp_ratio=8 / 3)
    block = build_stage_model(config, (0,), False, False, 0, torch.device("cpu"), torch.float32).layers["0"]
    shapes = sorted(
        (module.in_features, module.out_features, module.bias is not None)
        for module in block.modules()
        if isinstance(module, Linear)
    )
    assert shapes == sorted(block_linears(64, swiglu_width(64, 8 / 3)))
