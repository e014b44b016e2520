"""schedlang's GLA with flash-linear-attention's options against an independent float64 reference of fla's layer."""

from __future__ import annotations

import pytest
import torch

from fla_reference import fla_config, perturb, reference_logits
from schedlang.runtime.hf_format import fla_sources, read_fla_config, to_fla_tensors
from schedlang.runtime.kv_buffers import ChunkPosition, SequenceKV
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import GlaOptions, LayerKind, ModelConfig, ModelOptions, OutputGate

CONFIGS = {
    "fla_defaults": fla_config(),
    "grouped_kv_heads_clamped_gate": fla_config(num_heads=4, num_kv_heads=2, clamp_min=-0.04, norm_eps=1e-5),
    "wide_keys_narrow_values_tied": fla_config(expand_k=1.0, expand_v=0.5, tie_word_embeddings=True),
    "intermediate_size": fla_config(intermediate_size=40, num_hidden_layers=3),
    "hybrid_attention_with_rope": fla_config(
        num_hidden_layers=3,
        attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2, "qkv_bias": True, "rope_theta": 500.0},
    ),
}


def _stage(model_config: ModelConfig, seed: int = 0):
    layers = tuple(range(len(model_config.layers)))
    model = build_stage_model(model_config, layers, True, True, seed=seed, device=torch.device("cpu"), dtype=torch.float64)
    perturb(model, seed + 1)
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_the_reference_whole_and_in_chunks(name):
    config = CONFIGS[name]
    model = _stage(read_fla_config(config).model_config())
    tokens = torch.randint(0, config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(3))
    expected = reference_logits(to_fla_tensors(dict(model.named_parameters()), model.config.layers), config, tokens)
    with torch.no_grad():
        hidden, _ = model(tokens, [None] * model.n_states)
        whole = model.logits(hidden)
        kv = SequenceKV(tokens.shape[1])  # attention layers read earlier chunks' keys and values here
        first, states = model(tokens[:, :10], [None] * model.n_states, ChunkPosition(kv, 0, 0, 10))
        second, _ = model(tokens[:, 10:], states, ChunkPosition(kv, 0, 10, tokens.shape[1]))
        chunked = model.logits(torch.cat([first, second], dim=1))
    torch.testing.assert_close(whole, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(chunked, expected, rtol=1e-9, atol=1e-9)


def test_the_clamp_and_the_grouping_change_the_logits():
    """The reference is sensitive to the options the comparison above relies on."""
    config = CONFIGS["grouped_kv_heads_clamped_gate"]
    model = _stage(read_fla_config(config).model_config())
    tensors = to_fla_tensors(dict(model.named_parameters()), model.config.layers)
    tokens = torch.randint(0, config["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(4))
    clamped = reference_logits(tensors, config, tokens)
    assert not torch.allclose(clamped, reference_logits(tensors, dict(config, clamp_min=None), tokens))


def test_fla_names_cover_every_parameter_once_and_tied_models_have_no_head():
    config = CONFIGS["wide_keys_narrow_values_tied"]
    model = _stage(read_fla_config(config).model_config())
    layers = model.config.layers
    names = [source for name, _ in model.named_parameters() for source in fla_sources(name, layers)]
    assert len(names) == len(set(names))
    assert "lm_head.weight" not in names and "model.embeddings.weight" in names
    assert "model.layers.1.attn.gk_proj.0.weight" in names and "model.layers.0.mlp.up_proj.weight" in names


def test_default_options_keep_todays_parameters():
    """No option set: the GLA layer has its full-rank gate with bias and no output gate, as before."""
    config = ModelConfig(vocab=16, d_model=8, layers=("gla",), heads=2, head_dim=4)
    assert config.options == ModelOptions()
    model = build_stage_model(config, (0,), True, True, 0, torch.device("cpu"), torch.float32)
    shapes = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
    assert shapes["layers.0.mixer.gate_proj.weight"] == (8, 8) and shapes["layers.0.mixer.gate_proj.bias"] == (8,)
    assert not any("output" in name for name in shapes)
    with pytest.raises(KeyError, match="no tensor"):
        fla_sources("layers.0.mixer.gate_proj.weight", (LayerKind.GLA,))


def test_low_rank_gate_and_output_gate_train():
    """Gradients reach every parameter of the fla-shaped layer, the clamp included (above its floor)."""
    options = ModelOptions(gla=GlaOptions(head_k_dim=4, kv_heads=1, gate_rank=3, gate_clamp_min=-1.0, output_gate=OutputGate.SWISH))
    config = ModelConfig(vocab=16, d_model=8, layers=("gla", "gla"), heads=2, head_dim=4, options=options)
    model = build_stage_model(config, (0, 1), True, True, 0, torch.device("cpu"), torch.float32)
    tokens = torch.randint(0, 16, (1, 8), generator=torch.Generator().manual_seed(5))
    hidden, _ = model(tokens, [None, None])
    model.loss(hidden, tokens).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
