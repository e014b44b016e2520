"""``model { from = hf("dir") }``: the checker's reading of a directory, its errors, and its weights in training."""

from __future__ import annotations

import json
import runpy

import pytest
import torch

from fla_reference import fla_config, perturb, reference_logits, write_hf_directory
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program
from schedlang.runtime.hf_format import read_fla_config, to_fla_tensors
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import OutputGate

pytest.importorskip("safetensors")

SCHEDULE = """schedule from_hf
model {{
  from = hf("{directory}"){extra}
}}
mesh {{ pipeline = {pipeline} }}
sequence {{ length = 32  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2 }}
train {{ steps = 1 }}
"""


def _schedule(tmp_path, directory="model", extra="", pipeline=1):
    path = tmp_path / "s.sched"
    path.write_text(SCHEDULE.format(directory=directory, extra=extra, pipeline=pipeline), encoding="utf-8")
    return path


def _errors(path) -> list[tuple[int, int, str]]:
    with pytest.raises(ScheduleError) as raised:
        load_program(path)
    return [(d.span.line, d.span.column, d.message) for d in raised.value.diagnostics]


def _hf_model(tmp_path, config, seed=0, rename=None):
    """A random fla model directory at tmp_path/model; returns its tensors."""
    model = build_stage_model(
        read_fla_config(config).model_config(), tuple(range(config["num_hidden_layers"])), True, True, seed,
        torch.device("cpu"), torch.float32,
    )
    perturb(model, seed + 7)
    tensors = to_fla_tensors(dict(model.named_parameters()), model.config.layers)
    if rename is not None:
        tensors = {rename(name): tensor for name, tensor in tensors.items()}
    write_hf_directory(tmp_path / "model", tensors, config)
    return tensors


def test_the_directory_fills_the_model_block_relative_to_the_schedule(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(fla_config(num_kv_heads=1, clamp_min=-3.0)))
    program = load_program(_schedule(tmp_path))
    model = program.model
    assert (model.vocab, model.d_model, len(model.layers), model.heads, model.head_dim) == (61, 32, 2, 2, 16)
    # 2/3 of 4 * 32, up to a multiple of 256, as fla's GatedMLP
    assert (model.mlp_ratio, model.options.mlp_width) == (4.0, 256)
    assert (model.options.gla.head_k_dim, model.options.gla.kv_heads, model.options.gla.gate_rank) == (8, 1, 16)
    assert model.options.gla.gate_clamp_min == -3.0 and model.options.gla.output_gate is OutputGate.SWISH
    assert model.options.initial_weights is None  # a config without safetensors: the seed's weights


def test_written_keys_win_and_are_checked(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(fla_config()))
    program = load_program(_schedule(tmp_path, extra="\n  layers = [gla] * 4\n  norm_eps = 1e-5"))
    assert len(program.model.layers) == 4 and program.model.norm_eps == 1e-5
    errors = _errors(_schedule(tmp_path, extra="\n  kv_heads = 3"))
    assert errors == [(4, 3, "kv_heads = 3 must divide heads = 2: each key/value head serves heads / kv_heads query heads")]


@pytest.mark.parametrize(
    "config, message",
    [
        (None, "Hugging Face model directory 'model' does not exist"),
        ({}, "'model' has no config.json"),
        (
            fla_config(model_type="llama"),
            "model_type is 'llama'; schedlang reads flash-linear-attention's 'gla', 'gated_deltanet', 'mamba2' and "
            "'mamba3' models",
        ),
        (fla_config(use_short_conv=True), "short convolutions"),
        (fla_config(expand_k=0.3), "config field 'expand_k' gives a width of 9.6, not a whole multiple of num_heads = 2"),
        (fla_config(num_kv_heads=3), "num_kv_heads = 3 does not divide num_heads = 2"),
    ],
)
def test_a_bad_directory_is_an_error_at_the_from_value(tmp_path, config, message):
    if config is not None:
        (tmp_path / "model").mkdir()
        if config:
            (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    ((line, column, text),) = _errors(_schedule(tmp_path))
    assert (line, column) == (3, 10)
    assert message in text


def test_cli_check_points_at_the_from_key(tmp_path):
    from schedlang.cli import main

    path = _schedule(tmp_path, directory="missing")
    assert main(["check", str(path)]) == 1


def test_tied_embeddings_are_read_for_any_pipeline(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(fla_config(tie_word_embeddings=True)))
    program = load_program(_schedule(tmp_path, pipeline=2))
    assert program.model.options.tie_embeddings and program.mesh.pipeline == 2


def test_hf_takes_its_path_alone_and_other_calls_do_not(tmp_path):
    path = _schedule(tmp_path, directory="model")
    text = path.read_text().replace("train { steps = 1 }", "train { steps = 1  optimizer = adamw(3e-3) }")
    path.write_text(text)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(fla_config()))
    ((line, column, message),) = _errors(path)
    assert (line, message) == (8, "arguments of adamw are written name = value")


@pytest.mark.parametrize("fused_norm_names", [True, False], ids=["fuse_norm", "unfused_norm"])
def test_the_weights_are_the_initial_weights_on_every_stage(tmp_path, fused_norm_names):
    """Compiled for two pipeline stages: each stage's script model holds the directory's tensors."""
    config = fla_config(num_hidden_layers=2, clamp_min=-0.05, fuse_norm=fused_norm_names)

    def rename(name):
        return name if fused_norm_names else name.replace("g_norm_swish_gate", "g_norm")

    tensors = _hf_model(tmp_path, config, rename=rename)
    from schedlang.cli import main

    assert main(["compile", str(_schedule(tmp_path, pipeline=2)), "-o", str(tmp_path / "train.py")]) == 0
    model_config = runpy.run_path(str(tmp_path / "train.py"))["MODEL"]
    assert model_config.options.initial_weights == str((tmp_path / "model").resolve())
    first = build_stage_model(model_config, (0,), True, False, 123, torch.device("cpu"), torch.float64)
    last = build_stage_model(model_config, (1,), False, True, 456, torch.device("cpu"), torch.float64)
    tokens = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden, _ = first(tokens, [None])
        hidden, _ = last(hidden, [None])
        logits = last.logits(hidden)
    torch.testing.assert_close(logits, reference_logits(tensors, config, tokens), rtol=1e-9, atol=1e-9)


def test_weights_of_another_shape_are_refused(tmp_path):
    from schedlang.runtime.hf_weights import HfWeightsError

    _hf_model(tmp_path, fla_config())
    model_config = read_fla_config(fla_config(hidden_size=64)).model_config(str(tmp_path / "model"))
    with pytest.raises(HfWeightsError, match="has shape"):
        build_stage_model(model_config, (0, 1), True, True, 0, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    "extra, message",
    [
        ("\n  layers = [gla] * 3", "its weights have no tensor model.layers.2.attn_norm.weight"),
        ("\n  kv_heads = 1", "its tensors for schedlang's layers.0.mixer.k_proj.weight have 16 rows, but the model's have 8"),
        ("\n  gate_low_rank_dim = none", "has no tensor for schedlang's layers.0.mixer.gate_proj.weight"),
    ],
)
def test_written_keys_that_do_not_fit_the_weights_are_an_error_at_from(tmp_path, extra, message):
    _hf_model(tmp_path, fla_config())
    ((line, column, text),) = _errors(_schedule(tmp_path, extra=extra))
    assert (line, column) == (3, 10)
    assert text.startswith("the model of 'model.from' does not fit its weights") and message in text
