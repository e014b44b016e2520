"""schedlang's gdn layer with fla's options against a float64 token-by-token reference of fla's Gated DeltaNet
(tests/models/fla_gdn_reference.py), and the short convolutions' state across chunks."""

from __future__ import annotations

import pytest
import torch

from fla_gdn_reference import gdn_config, gdn_reference_logits
from fla_reference import perturb
from schedlang.runtime.hf_format import fla_sources, read_fla_config, to_fla_tensors
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import DeltaGates, GdnOptions, LayerKind, ModelConfig, ModelOptions


def _stage(model_config: ModelConfig, dtype=torch.float64):
    layers = tuple(range(len(model_config.layers)))
    return build_stage_model(model_config, layers, True, True, 0, torch.device("cpu"), dtype)


def _logits(model, tokens):
    with torch.no_grad():
        hidden, _ = model(tokens, [None] * model.n_states)
        return model.logits(hidden)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"tie_word_embeddings": True},
        {"conv_size": 2, "expand_v": 1.0},
        {"head_dim": 4, "intermediate_size": 40},
        {"num_hidden_layers": 3, "attn": {"layers": [0, 2], "num_heads": 2, "num_kv_heads": 1, "qkv_bias": True}},
        {"num_v_heads": 4},
        {"num_v_heads": 6, "head_dim": 4, "expand_v": 1.5, "conv_size": 3},
        {"num_heads": 1, "num_v_heads": 3, "num_hidden_layers": 3, "attn": {"layers": [1], "num_heads": 2}},
    ],
)
def test_the_gdn_layer_is_flas_gated_deltanet(changes):
    config = gdn_config(**changes)
    model = _stage(read_fla_config(config).model_config())
    perturb(model, 1)
    tokens = torch.randint(0, config["vocab_size"], (2, 21), generator=torch.Generator().manual_seed(0))
    expected = gdn_reference_logits(to_fla_tensors(dict(model.named_parameters()), model.config.layers), config, tokens)
    torch.testing.assert_close(_logits(model, tokens), expected, rtol=1e-9, atol=1e-9)


def test_a_wrong_value_head_order_would_be_caught(monkeypatch):
    """Grouped value heads: repeating q and k as whole blocks (value head j reading q/k head j mod heads)
    instead of fla's j // (value_heads / heads) disagrees with the reference (the GVA cases can fail)."""
    from schedlang.kernels.gdn import chunk as gdn_operator

    config = gdn_config(num_v_heads=4)
    model = _stage(read_fla_config(config).model_config())
    perturb(model, 1)
    tensors = to_fla_tensors(dict(model.named_parameters()), model.config.layers)
    tokens = torch.randint(0, config["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(0))
    assert (_logits(model, tokens) - gdn_reference_logits(tensors, config, tokens)).abs().max() < 1e-9
    monkeypatch.setattr(
        gdn_operator, "repeat_each_head", lambda per_head, heads: per_head.repeat(1, 1, heads // per_head.shape[2], 1)
    )
    assert (_logits(model, tokens) - gdn_reference_logits(tensors, config, tokens)).abs().max() > 1e-4


def test_a_wrong_conv_tap_order_would_be_caught():
    """The reference and the model disagree when a convolution's taps are reversed (the test can fail)."""
    config = gdn_config()
    model = _stage(read_fla_config(config).model_config())
    perturb(model, 1)
    tensors = to_fla_tensors(dict(model.named_parameters()), model.config.layers)
    tensors["model.layers.0.attn.k_conv1d.weight"] = tensors["model.layers.0.attn.k_conv1d.weight"].flip(-1)
    tokens = torch.randint(0, config["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(0))
    assert (_logits(model, tokens) - gdn_reference_logits(tensors, config, tokens)).abs().max() > 1e-4


@pytest.mark.parametrize("value_heads", [None, 4], ids=["value_heads=heads", "grouped value heads"])
@pytest.mark.parametrize(
    "boundaries",
    [(0, 16, 32), (0, 8, 16, 24, 32), (0, 1, 3, 4, 20, 21, 32), (0, 2, 30, 32)],
    ids=["2 chunks", "4 chunks", "chunks shorter than conv_size - 1", "a short first chunk"],
)
def test_chunked_equals_unchunked_with_short_convolutions(boundaries, value_heads):
    """The packed state (recurrent matrix and the convolutions' last inputs) carries every chunk into the next:
    outputs, final states and gradients (parameters and input) equal the one-chunk run."""
    config = gdn_config(conv_size=4, num_v_heads=value_heads)
    model = _stage(read_fla_config(config).model_config())
    perturb(model, 2)
    tokens = torch.randint(0, config["vocab_size"], (2, boundaries[-1]), generator=torch.Generator().manual_seed(3))

    def run(cuts):
        model.zero_grad()
        states, outputs = [None] * model.n_states, []
        for start, end in zip(cuts, cuts[1:]):
            hidden, states = model(tokens[:, start:end], states)
            outputs.append(hidden)
        hidden = torch.cat(outputs, dim=1)
        (model.logits(hidden).sin().sum() + sum(state.square().sum() for state in states)).backward()
        return hidden.detach(), [state.detach() for state in states], {
            name: parameter.grad.clone() for name, parameter in model.named_parameters()
        }

    whole, whole_states, whole_gradients = run((0, boundaries[-1]))
    chunked, chunked_states, chunked_gradients = run(boundaries)
    torch.testing.assert_close(chunked, whole, rtol=1e-10, atol=1e-10)
    for chunked_state, whole_state in zip(chunked_states, whole_states):
        torch.testing.assert_close(chunked_state, whole_state, rtol=1e-10, atol=1e-10)
    for name, gradient in whole_gradients.items():
        torch.testing.assert_close(chunked_gradients[name], gradient, rtol=1e-8, atol=1e-10, msg=name)


def test_the_packed_state_holds_the_last_inputs_of_q_k_and_v():
    config = gdn_config(conv_size=3)
    model = _stage(read_fla_config(config).model_config())
    _, states = model(torch.zeros(2, 5, dtype=torch.long), [None] * model.n_states)
    heads, dk, dv = 2, 8, 16
    assert states[0].shape == (2, heads * dk * dv + 2 * (2 * heads * dk + heads * dv))


def test_grouped_value_heads_size_the_state_by_the_value_heads():
    """With num_v_heads = 6 over 2 q/k heads the delta-rule state is [6, K, V] and the convolutions keep
    2 q/k heads' and 6 value heads' last inputs."""
    config = gdn_config(conv_size=3, num_v_heads=6)
    model = _stage(read_fla_config(config).model_config())
    _, states = model(torch.zeros(2, 5, dtype=torch.long), [None] * model.n_states)
    heads, value_heads, dk, dv = 2, 6, 8, 16
    assert states[0].shape == (2, value_heads * dk * dv + 2 * (2 * heads * dk + value_heads * dv))
    recurrent, _ = model.layers["0"].mixer.packed_state.unpack(states[0])
    assert recurrent.shape == (2, value_heads, dk, dv)


@pytest.mark.parametrize("value_heads", [2, 6])
def test_layer_parameters_count_flas_grouped_value_layer(tmp_path, value_heads):
    """lowering.parameters counts a gdn block as fla's GatedDeltaNet layer holds it: q, k and their
    convolutions at num_heads * head_dim, v, g, o and v's convolution at num_v_heads * head_v_dim, a, b, A_log
    and dt_bias at num_v_heads, o_norm at head_v_dim (fla/layers/gated_deltanet.py), plus the block's two
    norms and SwiGLU."""
    from schedlang.frontend import load_program
    from schedlang.lowering.parameters import layer_parameters

    schedule = tmp_path / "gva.sched"
    schedule.write_text(
        f"""schedule gva_parameters
model {{
  vocab = 64  d_model = 32  heads = 2  head_dim = 6  layers = [gdn] * 2  mlp = swiglu(intermediate_size = 40)
  expand_k = 0.25  value_heads = {value_heads}  delta_gates = mamba  short_conv_size = 3
}}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2 }}
""",
        encoding="utf-8",
    )
    d, heads, dk, dv, taps, width = 32, 2, 4, 6, 3, 40
    key_dim, value_dim = heads * dk, value_heads * dv
    fla_layer = (
        2 * d * key_dim + 2 * d * value_dim + value_dim * d  # q, k; v, g; o
        + 2 * d * value_heads + 2 * value_heads  # a, b; A_log, dt_bias
        + taps * (2 * key_dim + value_dim) + dv  # the three convolutions; o_norm
    )
    count = layer_parameters(load_program(schedule).model, LayerKind.GDN)
    assert count.total == fla_layer + 2 * d + 3 * d * width


def test_default_gdn_options_keep_todays_parameters():
    """No option set: gate and beta projections with bias, no convolutions, no Mamba2 parameters; the state is
    the bare [B, H, K, V] matrix."""
    config = ModelConfig(vocab=16, d_model=8, layers=("gdn",), heads=2, head_dim=4)
    assert config.options == ModelOptions()
    model = _stage(config)
    shapes = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
    assert shapes["layers.0.mixer.gate_proj.bias"] == (2,) and shapes["layers.0.mixer.beta_proj.bias"] == (2,)
    assert not any("conv" in name or "gate_log_rate" in name for name in shapes)
    _, states = model(torch.zeros(1, 3, dtype=torch.long), [None])
    assert states[0].shape == (1, 2, 4, 4)


def test_mamba_gates_follow_flas_initialisation():
    """A_log is log(U(0, 16)) and softplus(dt_bias) lies in fla's [1e-3, 0.1]."""
    options = ModelOptions(gdn=GdnOptions(gates=DeltaGates.MAMBA, short_conv_size=4))
    config = ModelConfig(vocab=16, d_model=8, layers=("gdn",) * 3, heads=64, head_dim=2, options=options)
    model = _stage(config)
    for index in range(3):
        mixer = model.layers[str(index)].mixer
        assert mixer.gate_log_rate.exp().min() >= 0 and mixer.gate_log_rate.exp().max() <= 16
        step = torch.nn.functional.softplus(mixer.gate_time_bias)
        assert step.min() >= 1e-3 - 1e-9 and step.max() <= 0.1 + 1e-9
        assert mixer.gate_proj.bias is None and mixer.beta_proj.bias is None


def test_every_parameter_has_its_fla_name():
    model = _stage(read_fla_config(gdn_config(tie_word_embeddings=True)).model_config())
    layers = model.config.layers
    names = [source for name, _ in model.named_parameters() for source in fla_sources(name, layers)]
    assert len(names) == len(set(names))
    assert "lm_head.weight" not in names
    for expected in ("A_log", "dt_bias", "a_proj.weight", "b_proj.weight", "q_conv1d.weight", "o_norm.weight"):
        assert f"model.layers.1.attn.{expected}" in names
    with pytest.raises(KeyError, match="Gated DeltaNet has no tensor"):
        fla_sources("layers.0.mixer.gate_proj.bias", (LayerKind.GDN,))


@pytest.mark.parametrize("value_heads", ["", "value_heads = 4"])
def test_the_memory_models_state_term_counts_the_packed_state(tmp_path, value_heads):
    """lowering.memory_terms.state_bytes equals the bytes of the states the runtime hands between chunks
    (with grouped value heads too)."""
    from schedlang.frontend import load_program
    from schedlang.lowering.memory_terms import state_bytes

    schedule = tmp_path / "gdn.sched"
    schedule.write_text(
        """schedule gdn_state
model {
  vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = [gdn] * 2
  expand_k = 0.5  delta_gates = mamba  short_conv_size = 4  VALUE_HEADS
}
sequence { length = 64  chunks = 2  kernel_chunk = 16 }
pipeline { microbatches = 2  microbatch_size = 3 }
""".replace("VALUE_HEADS", value_heads),
        encoding="utf-8",
    )
    program = load_program(schedule)
    assert program.model.options.gdn.value_heads == (4 if value_heads else None)
    model = _stage(program.model, torch.float32)
    _, states = model(torch.zeros(3, 8, dtype=torch.long), [None] * model.n_states)
    assert state_bytes(program, 0) == sum(state.numel() * state.element_size() for state in states)
