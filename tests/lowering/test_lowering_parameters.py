"""lowering.parameters counts what schedlang.runtime.model builds (the runtime's model on the meta device)."""

import pytest
import torch

from lowering_programs import make_program
from schedlang.lowering.parameters import stage_parameters
from schedlang.runtime.linear import Linear
from schedlang.runtime.model import StageModel
from schedlang.vocabulary import LayerKind, MlpKind, ModelConfig


def runtime_stage_counts(config: ModelConfig, program, stage: int) -> tuple[int, int]:
    """(weights of linear layers, all parameters) of the runtime's ``stage``, built on the meta device."""
    indices = program.stage_layers[stage]
    with torch.device("meta"):
        built = StageModel(config, indices, stage == 0, stage == len(program.stage_layers) - 1)
    linear_weights = sum(module.weight.numel() for module in built.modules() if isinstance(module, Linear))
    return linear_weights, sum(parameter.numel() for parameter in built.parameters())


@pytest.mark.parametrize(
    "layers, mlp_ratio",
    [
        ((LayerKind.GLA, LayerKind.SIMPLE_GLA, LayerKind.GDN, LayerKind.ATTN), 8 / 3),
        ((LayerKind.GLA, LayerKind.ATTN), 0.0),
        ((LayerKind.GDN, LayerKind.SIMPLE_GLA), 2.7),
        ((LayerKind.GLA, LayerKind.MLP, LayerKind.SIMPLE_GLA, LayerKind.MLP), 8 / 3),
        ((LayerKind.MLP, LayerKind.GLA, LayerKind.GDN, LayerKind.MLP), 2.0),
    ],
)
def test_stage_counts_equal_the_runtime_model(layers, mlp_ratio):
    program = make_program(2, 1, 1, layers=layers)
    model = ModelConfig(vocab=300, d_model=96, layers=layers, heads=3, head_dim=32, mlp_ratio=mlp_ratio)
    program = program.__class__(**{**program.__dict__, "model": model})
    for stage in range(len(program.stage_layers)):
        count = stage_parameters(program, stage)
        assert (count.linear_weights, count.total) == runtime_stage_counts(model, program, stage), (stage, layers)


def test_separate_mlp_layers_hold_the_same_parameters_and_flops():
    """[Note: separate MLP layers]: [gla, mlp] * L is the network [gla] * L, for the counts and the FLOPS model."""
    from dataclasses import replace

    from schedlang.lowering.cost import FlopsCostModel
    from schedlang.vocabulary.actions import TaskId

    blocks = make_program(2, 2, 2, layers=(LayerKind.GLA, LayerKind.SIMPLE_GLA) * 2)
    split = make_program(2, 2, 2, layers=(LayerKind.GLA, LayerKind.MLP, LayerKind.SIMPLE_GLA, LayerKind.MLP) * 2)
    for program in (blocks, split):
        assert program.model.mlp_kind is MlpKind.SWIGLU
    total = [sum(stage_parameters(program, stage).total for stage in range(2)) for program in (blocks, split)]
    assert total[0] == total[1]
    seconds = []
    for program in (blocks, split):
        model = FlopsCostModel(replace(program, pipeline=replace(program.pipeline, microbatches=1)))
        seconds.append(sum(model.task_duration(TaskId.forward(stage, 0, 0)) for stage in range(2)))
    assert seconds[0] == pytest.approx(seconds[1], rel=1e-12)
    # and the coefficients of StateFlow's balanced cut (Eq. 9) see the same model
    from schedlang.lowering.partition import layer_flop_coefficients

    assert layer_flop_coefficients(blocks.model, 64) == layer_flop_coefficients(split.model, 64)
    # the split program's stages end between a mixer and its MLP: stage 0 holds layers 0-3 of 8
    assert split.stage_layers[0] == (0, 1, 2, 3)


def test_stage_counts_follow_the_layer_options_the_runtime_honours():
    """fla-shaped options change what a layer holds (narrow keys, grouped key/value heads, low-rank gates, output
    gates, Mamba gates, short convolutions, attention heads with biases, an explicit MLP width): the counts equal
    the runtime model built from the program's model record, and differ from the same model without options."""
    from dataclasses import replace

    from schedlang.lowering.parameters import mlp_width
    from schedlang.vocabulary import AttentionOptions, DeltaGates, GdnOptions, GlaOptions, ModelOptions, OutputGate

    layers = (LayerKind.GLA, LayerKind.GDN, LayerKind.ATTN, LayerKind.GLA)
    program = make_program(2, 1, 1, layers=layers)
    plain = ModelConfig(vocab=300, d_model=96, layers=layers, heads=4, head_dim=32, mlp_ratio=8 / 3)
    shaped = replace(
        plain,
        options=ModelOptions(
            mlp_width=200,
            gla=GlaOptions(head_k_dim=16, kv_heads=2, gate_rank=8, output_gate=OutputGate.SWISH),
            gdn=GdnOptions(head_k_dim=16, gates=DeltaGates.MAMBA, short_conv_size=4),
            attention=AttentionOptions(heads=6, head_dim=16, kv_heads=2, qkv_bias=True),
        ),
    )
    assert mlp_width(shaped) == 200
    totals = {}
    for name, model in (("plain", plain), ("shaped", shaped)):
        staged = replace(program, model=model)
        for stage in range(len(staged.stage_layers)):
            linear_weights, total = runtime_stage_counts(model, staged, stage)
            count = stage_parameters(staged, stage)
            assert (count.linear_weights, count.total) == (linear_weights, total), (name, stage)
            totals[name, stage] = total
    assert all(totals["plain", stage] != totals["shaped", stage] for stage in range(2))


@pytest.mark.parametrize(
    "kind", [LayerKind.GLA, LayerKind.SIMPLE_GLA, LayerKind.GDN, LayerKind.MAMBA2, LayerKind.MAMBA3, LayerKind.ATTN]
)
def test_projection_flops_are_twice_the_mixers_linear_weights(kind):
    """The cost model's projection FLOPs count the mixer the runtime builds: with the default options they are
    the closed form of docs/cost-model.md; with fla-shaped options (narrow keys, grouped heads, low-rank and
    output gates, short convolutions, grouped value heads, attention heads of their own) they follow the
    runtime's linear layers, which the closed form does not see."""
    from dataclasses import replace

    from schedlang.lowering.cost import layer_projection_flops_per_token, mixer_projection_flops_per_token
    from schedlang.runtime.model import Block
    from schedlang.vocabulary import (
        AttentionOptions, DeltaGates, GdnOptions, GlaOptions, Mamba2Options, Mamba3Options, ModelOptions,
        OutputGate,
    )

    plain = ModelConfig(vocab=300, d_model=96, layers=(kind,), heads=4, head_dim=32, mlp_ratio=2.0)
    shaped = replace(
        plain,
        options=ModelOptions(
            gla=GlaOptions(head_k_dim=16, kv_heads=2, gate_rank=8, output_gate=OutputGate.SWISH),
            gdn=GdnOptions(head_k_dim=16, gates=DeltaGates.MAMBA, short_conv_size=4, value_heads=8),
            attention=AttentionOptions(heads=6, head_dim=16, kv_heads=2, qkv_bias=True),
            mamba2=Mamba2Options(state_size=16, n_groups=2, use_bias=True),
            mamba3=Mamba3Options(state_size=16, n_groups=2, use_bias=True, rope_fraction=1.0),
        ),
    )
    assert layer_projection_flops_per_token(plain, kind) == mixer_projection_flops_per_token(kind, 96, 4, 32)
    with torch.device("meta"):
        mixer = Block(shaped, kind).mixer
    weights = sum(module.weight.numel() for module in mixer.modules() if isinstance(module, Linear))
    assert layer_projection_flops_per_token(shaped, kind) == 2 * weights
    if kind is not LayerKind.SIMPLE_GLA:  # the options leave simple_gla as it is
        assert layer_projection_flops_per_token(shaped, kind) != layer_projection_flops_per_token(plain, kind)
