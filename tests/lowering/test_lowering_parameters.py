"""lowering.parameters counts what schedlang.runtime.model builds (the runtime's model on the meta device)."""

import pytest
import torch

from lowering_programs import make_program
from schedlang.lowering.parameters import stage_parameters
from schedlang.lowering.program import LayerKind, MlpKind, MlpSpec, ModelSpec
from schedlang.runtime.config import MixerKind, ModelConfig
from schedlang.runtime.linear import Linear
from schedlang.runtime.model import StageModel


@pytest.mark.parametrize(
    "layers, mlp",
    [
        ((LayerKind.GLA, LayerKind.SIMPLE_GLA, LayerKind.GDN, LayerKind.ATTN), MlpSpec(MlpKind.SWIGLU, 8 / 3)),
        ((LayerKind.GLA, LayerKind.ATTN), MlpSpec(MlpKind.NONE)),
        ((LayerKind.GDN, LayerKind.SIMPLE_GLA), MlpSpec(MlpKind.SWIGLU, 2.7)),
    ],
)
def test_stage_counts_equal_the_runtime_model(layers, mlp):
    program = make_program(2, 1, 1, layers=layers)
    model = ModelSpec(vocab=300, d_model=96, layers=layers, heads=3, head_dim=32, mlp=mlp)
    program = program.__class__(**{**program.__dict__, "model": model})
    config = ModelConfig(
        vocab=300, d_model=96, layers=tuple(MixerKind(kind.value) for kind in layers), heads=3, head_dim=32,
        mlp_ratio=0.0 if mlp.kind is MlpKind.NONE else mlp.ratio,
    )
    for stage, indices in enumerate(program.stage_layers):
        with torch.device("meta"):
            built = StageModel(config, indices, stage == 0, stage == len(program.stage_layers) - 1)
        linear_weights = sum(module.weight.numel() for module in built.modules() if isinstance(module, Linear))
        total = sum(parameter.numel() for parameter in built.parameters())
        count = stage_parameters(program, stage)
        assert (count.linear_weights, count.total) == (linear_weights, total), (stage, layers)
