"""fla's ``Mamba2ForCausalLM`` directories: ``from = hf`` fills the model block and loads the weights (logits
against the float64 re-statement and, when fla is installed, against fla's own model), refusals at the ``from``
value naming the field, and ``export-model`` back to a directory fla loads with the same logits."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fla_mamba2_reference import mamba2_logits
from fla_reference import (
    import_fla,
    model_logits,
    perturb,
    perturbed_fla_tensors,
    relative_error,
    schedule_errors,
    write_hf_directory,
)
from schedlang.cli import main
from schedlang.frontend import load_program
from schedlang.vocabulary import MlpKind
from schedlang.runtime.hf_format import read_fla_config
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import LayerKind

pytest.importorskip("safetensors")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SCHEDULE = """schedule from_hf_mamba2
model {{
  from = hf("model"){extra}
}}
mesh {{ pipeline = {pipeline}  sequence = {sequence} }}
sequence {{ length = 64  chunks = 2  kernel_chunk = {kernel_chunk} }}
pipeline {{ microbatches = 2 }}
train {{ steps = 1 }}
"""


def mamba2_config(**changes) -> dict:
    """A small Mamba2 config.json as fla 0.6.0's Mamba2Config writes it (its defaults, smaller sizes)."""
    config = {
        "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "vocab_size": 61, "hidden_size": 32,
        "num_hidden_layers": 2, "head_dim": 16, "num_heads": 4, "expand": 2, "state_size": 8, "n_groups": 1,
        "conv_kernel": 4, "use_bias": False, "use_conv_bias": True, "hidden_act": "silu", "rmsnorm": True,
        "norm_before_gate": False, "D_has_hdim": False, "A_init_range": [1, 16], "conv_init": None,
        "dt_min": 0.001, "dt_max": 0.1, "dt_init_floor": 1e-4, "dt_limit": [0.0, math.inf], "norm_eps": 1e-5,
        "chunk_size": 256, "residual_in_fp32": True, "tie_word_embeddings": False,
    }
    config.update(changes)
    return config


def _schedule(tmp_path, config, extra="", pipeline=1, sequence=1, kernel_chunk=16, tensors=None):
    if tensors is None:
        (tmp_path / "model").mkdir(exist_ok=True)
        (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    else:
        write_hf_directory(tmp_path / "model", tensors, config)
    path = tmp_path / "s.sched"
    text = SCHEDULE.format(extra=extra, pipeline=pipeline, sequence=sequence, kernel_chunk=kernel_chunk)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_directory_fills_the_model_block(tmp_path):
    config = mamba2_config(n_groups=2, conv_kernel=3, use_bias=True, dt_limit=[0.01, math.inf])
    model = load_program(_schedule(tmp_path, config)).model
    assert model.layers == (LayerKind.MAMBA2,) * 2 and (model.heads, model.head_dim) == (4, 16)
    assert model.mlp_kind is MlpKind.NONE and model.norm_eps == 1e-5
    mamba2 = model.options.mamba2
    assert (mamba2.state_size, mamba2.n_groups, mamba2.conv_kernel, mamba2.use_bias) == (8, 2, 3, True)
    assert mamba2.dt_limit == (0.01, None)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"is_mimo": True, "mimo_rank": 4}, "is_mimo"),
        ({"model_type": "mamba"}, "model_type"),
        ({"attn": {"layers": [1], "num_heads": 2}}, "attn"),
        ({"D_has_hdim": True}, "D_has_hdim"),
        ({"rmsnorm": False}, "rmsnorm"),
        ({"norm_before_gate": True}, "norm_before_gate"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"n_groups": 3}, "n_groups"),
        ({"num_heads": 3}, "num_heads"),
        ({"expand": 1.5, "head_dim": 7}, "expand"),
        ({"dt_limit": [0.5, 0.1]}, "dt_limit"),
    ],
)
def test_what_schedlang_does_not_build_is_an_error_at_the_from_value_naming_the_field(tmp_path, changes, field):
    ((line, column, text),) = schedule_errors(_schedule(tmp_path, mamba2_config(**changes)))
    assert (line, column) == (3, 10)
    assert f"'{field}'" in text or f"{field} " in text


def test_each_sequence_rank_must_hold_the_convolutions_history(tmp_path):
    """At the ``from`` key when the directory gave conv_kernel, at conv_kernel when the schedule wrote it."""
    load_program(_schedule(tmp_path, mamba2_config(conv_kernel=5), sequence=2, kernel_chunk=4))
    path = _schedule(tmp_path, mamba2_config(conv_kernel=5), sequence=2, kernel_chunk=2)
    ((line, column, text),) = schedule_errors(path)
    assert (line, column) == (3, 3)
    assert text == (
        "with mesh.sequence = 2 each rank's slice of a chunk must hold conv_kernel - 1 = 4 tokens for the next "
        "rank's convolution, but kernel_chunk = 2"
    )
    path = _schedule(tmp_path, mamba2_config(), extra="\n  conv_kernel = 8", sequence=2, kernel_chunk=4)
    written = schedule_errors(path)
    assert [(line, column) for line, column, _ in written] == [(4, 3)]


@pytest.mark.parametrize("pipeline", [1, 2])
def test_the_weights_give_the_logits_of_the_float64_restatement(tmp_path, pipeline):
    """Loaded on one or two stages (every stage reads its own tensors), float32 within 1e-5."""
    config = mamba2_config(n_groups=2, use_bias=True, dt_limit=[0.001, 1.5])
    tensors = perturbed_fla_tensors(config)
    program = load_program(_schedule(tmp_path, config, pipeline=pipeline, tensors=tensors))
    model_config = program.model
    tokens = torch.randint(0, config["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    hidden = tokens
    for stage, layers in enumerate(program.stage_layers):
        model = build_stage_model(model_config, layers, stage == 0, stage == len(program.stage_layers) - 1, 0,
                                  torch.device("cpu"), torch.float32)
        with torch.no_grad():
            hidden, _ = model(hidden, [None] * model.n_states)
    with torch.no_grad():
        logits = model.logits(hidden)
    assert relative_error(logits, mamba2_logits(tensors, config, tokens)) < 1e-5


def _torch_rms_norm(fla_norm) -> torch.nn.RMSNorm:
    norm = torch.nn.RMSNorm(fla_norm.weight.shape[0], eps=fla_norm.eps)
    with torch.no_grad():
        norm.weight.copy_(fla_norm.weight)
    return norm


def _fla_logits(directory, tokens):
    """The float32 logits of fla's Mamba2ForCausalLM from ``directory``, its mixers on their PyTorch path
    (``torch_forward``); the Triton SiLU and block RMSNorms, which autotune and so need a GPU driver, replaced
    by torch's same functions. fla's gated norm inside the mixer is Triton: interpreted on the CPU where there
    is no GPU (tests/conftest.py), compiled where there is one, so there the model runs on the GPU."""
    import_fla("fla.models")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    for layer in model.backbone.layers:
        layer.mixer.act = torch.nn.SiLU()
        layer.norm = _torch_rms_norm(layer.norm)
    model.backbone.norm_f = _torch_rms_norm(model.backbone.norm_f)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        return model.to(device).eval()(input_ids=tokens.to(device)).logits.cpu()


def test_fla_gives_the_same_logits_as_the_loaded_model(tmp_path):
    config = mamba2_config()
    tensors = perturbed_fla_tensors(config)
    program = load_program(_schedule(tmp_path, config, tensors=tensors))
    tokens = torch.randint(0, config["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(2))
    expected = _fla_logits(tmp_path / "model", tokens)
    assert relative_error(model_logits(program.model, tokens), expected) < 1e-5


def test_a_checkpoint_exports_to_a_directory_fla_loads_with_the_same_logits(tmp_path):
    from safetensors.torch import load_file

    from schedlang.runtime.checkpoint import save_checkpoint
    from schedlang.runtime.checkpoint_manifest import run_record
    from schedlang.runtime.config import PipelineConfig
    from schedlang.vocabulary import TrainConfig

    config = mamba2_config(conv_kernel=3, dt_limit=[0.0, 2.0], tie_word_embeddings=True)
    model_config = read_fla_config(config).model_config()
    ours = build_stage_model(model_config, (0, 1), True, True, 0, torch.device("cpu"), torch.float32)
    perturb(ours, 4)
    pipeline = PipelineConfig(((0, 1),), (0, 32), 1, 1, ((),))
    record = run_record(ours.config, pipeline, TrainConfig(), (1, 1, 1))
    save_checkpoint(str(tmp_path / "ckpt"), 1, ours, torch.optim.AdamW(ours.parameters()), record)
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "mamba2" and written["expand"] == 2 and written["dt_limit"] == [0.0, 2.0]
    assert read_fla_config(written) == read_fla_config(config)
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "backbone.layers.1.mixer.conv1d.bias" in exported and "lm_head.weight" not in exported
    assert torch.equal(exported["backbone.layers.0.mixer.A_log"], ours.state_dict()["layers.0.mixer.A_log"])
    tokens = torch.randint(0, config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    expected = model_logits(model_config, tokens, dict(ours.state_dict()))
    assert relative_error(mamba2_logits(exported, written, tokens), expected) < 1e-5
    assert relative_error(_fla_logits(tmp_path / "out", tokens), expected) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_cuda_bf16_logits_are_as_close_to_float64_as_flas_own(tmp_path):
    """bf16 on the GPU, a model of 1K tokens with fla's default head and state sizes: our logits' relative error
    against the float64 re-statement is at most 1.5x fla's own ``Mamba2ForCausalLM`` in bf16 on the same
    weights and tokens (its bf16 tolerance, measured rather than assumed), and under 2e-2."""
    import_fla("fla.models")
    transformers = pytest.importorskip("transformers")
    config = mamba2_config(vocab_size=512, hidden_size=256, num_heads=8, head_dim=64, state_size=64,
                           num_hidden_layers=2, n_groups=2)
    tensors = perturbed_fla_tensors(config, seed=5)
    program = load_program(_schedule(tmp_path, config, tensors=tensors))
    tokens = torch.randint(0, config["vocab_size"], (1, 1024), generator=torch.Generator().manual_seed(6))
    expected = mamba2_logits(tensors, config, tokens)
    ours = build_stage_model(program.model, tuple(range(config["num_hidden_layers"])), True, True, 0,
                             torch.device("cuda"), torch.bfloat16)
    fla = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.bfloat16)
    fla = fla.cuda().eval()
    with torch.no_grad():
        hidden, _ = ours(tokens.cuda(), [None] * ours.n_states)
        our_error = relative_error(ours.logits(hidden).cpu(), expected)
        # fla's Mamba2 without mamba_ssm / causal_conv1d (its Triton conv backend on CUDA) handed a float32
        # tensor to a bf16 linear layer on the H200 (2026-12-03); autocast gives that layer bf16 inputs, as a
        # bf16 training run under autocast would, and leaves the bf16 weights as they are
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fla_logits = fla(input_ids=tokens.cuda()).logits
        fla_error = relative_error(fla_logits.float().cpu(), expected)
    print(f"bf16 logits against float64: ours {our_error:.3e}, fla {fla_error:.3e}")
    assert our_error < 2e-2
    assert our_error <= 1.5 * fla_error
