"""``model { from = hf("dir") }`` of flash-linear-attention's Gated DeltaNet: the keys it gives, its refusals at
the ``from`` value, and its weights on two pipeline stages."""

from __future__ import annotations

import json
import runpy

import pytest
import torch

from fla_gdn_reference import gdn_config, gdn_reference_logits
from fla_reference import perturb, write_hf_directory
from schedlang.cli import main
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program
from schedlang.runtime.hf_format import read_fla_config, to_fla_tensors
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import DeltaGates, LayerKind

pytest.importorskip("safetensors")

SCHEDULE = """schedule from_hf_gdn
model {{
  from = hf("model"){extra}
}}
mesh {{ pipeline = {pipeline}  sequence = {sequence} }}
sequence {{ length = 64  chunks = 2  kernel_chunk = {kernel_chunk} }}
pipeline {{ microbatches = 2 }}
train {{ steps = 1 }}
"""


def _schedule(tmp_path, config, extra="", pipeline=1, sequence=1, kernel_chunk=16):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    path = tmp_path / "s.sched"
    text = SCHEDULE.format(extra=extra, pipeline=pipeline, sequence=sequence, kernel_chunk=kernel_chunk)
    path.write_text(text, encoding="utf-8")
    return path


def _errors(path) -> list[tuple[int, int, str]]:
    with pytest.raises(ScheduleError) as raised:
        load_program(path)
    return [(d.span.line, d.span.column, d.message) for d in raised.value.diagnostics]


def test_the_directory_fills_the_model_block(tmp_path):
    model = load_program(_schedule(tmp_path, gdn_config(head_dim=4, expand_v=1.5, conv_size=3))).model
    assert model.layers == (LayerKind.GDN,) * 2 and (model.heads, model.head_dim) == (2, 6)
    assert (model.mlp_ratio, model.options.mlp_width) == (4.0, 256)
    gdn, gla = model.options.gdn, model.options.gla
    assert (gdn.head_k_dim, gdn.gates, gdn.short_conv_size) == (4, DeltaGates.MAMBA, 3)
    assert gla.gate_rank is None and gla.kv_heads is None  # the gla-only keys keep their defaults
    assert model.options.gdn.value_heads is None


def test_num_v_heads_gives_the_value_heads(tmp_path):
    """fla's num_v_heads is value_heads; equal to num_heads (or a written value_heads = heads) it is no grouping,
    and a written value_heads wins over the directory's."""
    assert load_program(_schedule(tmp_path, gdn_config(num_v_heads=6))).model.options.gdn.value_heads == 6
    assert load_program(_schedule(tmp_path, gdn_config(num_v_heads=2))).model.options.gdn.value_heads is None
    written = _schedule(tmp_path, gdn_config(num_v_heads=6), extra="\n  value_heads = 4")
    assert load_program(written).model.options.gdn.value_heads == 4
    ((line, column, text),) = _errors(_schedule(tmp_path, gdn_config(num_v_heads=6), extra="\n  value_heads = 5"))
    assert (line, column) == (4, 3) and text.startswith("value_heads = 5 must be a multiple of heads = 2")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"attn": {"layers": [1], "num_heads": 2, "window_size": 8}}, "'window_size' = 8 selects sliding-window"),
        ({"attn": {"layers": [1], "num_heads": 2, "qk_norm": True}}, "'qk_norm' = True selects RMS-normalised"),
        ({"attn": [{"layers": [0], "num_heads": 2}, {"layers": [1], "num_heads": 1}]}, "the attention specs differ"),
        ({"num_v_heads": 3}, "'num_v_heads' = 3 is not a multiple of num_heads = 2"),
        ({"num_v_heads": 1}, "'num_v_heads' = 1 is not a multiple of num_heads = 2"),
        ({"use_short_conv": False}, "no short convolutions"),
        ({"use_gate": False}, "no output gate"),
        ({"allow_neg_eigval": True}, "negative eigenvalues"),
        ({"output_gate_activation": "sigmoid"}, "another output-gate activation"),
        ({"expand_v": 0.3}, "head_dim * expand_v = 2.4 is not a whole value width per head"),
    ],
)
def test_what_schedlang_does_not_build_is_an_error_at_the_from_value(tmp_path, changes, message):
    ((line, column, text),) = _errors(_schedule(tmp_path, gdn_config(**changes)))
    assert (line, column) == (3, 10)
    assert message in text


def test_silu_is_swish(tmp_path):
    load_program(_schedule(tmp_path, gdn_config(hidden_act="silu", output_gate_activation="silu")))


def test_each_sequence_rank_must_hold_the_short_convolutions_history(tmp_path):
    """Under mesh.sequence > 1 a rank's slice (whole kernel chunks) holds the next rank's short_conv_size - 1
    earlier inputs."""
    load_program(_schedule(tmp_path, gdn_config(), sequence=2, kernel_chunk=4))
    ((line, column, text),) = _errors(_schedule(tmp_path, gdn_config(), sequence=2, kernel_chunk=2))
    assert (line, column) == (3, 3)
    assert text == (
        "with mesh.sequence = 2 each rank's slice of a chunk must hold short_conv_size - 1 = 3 tokens for the next "
        "rank's short convolutions, but kernel_chunk = 2"
    )
    written = _errors(_schedule(tmp_path, gdn_config(), extra="\n  short_conv_size = 8", sequence=2, kernel_chunk=4))
    assert [(line, column) for line, column, _ in written] == [(4, 3)]
    load_program(_schedule(tmp_path, gdn_config(), extra="\n  short_conv_size = none", sequence=2, kernel_chunk=2))
    load_program(_schedule(tmp_path, gdn_config(), sequence=1, kernel_chunk=2))


@pytest.mark.parametrize("value_heads", [None, 4])
def test_the_weights_are_the_initial_weights_on_two_stages(tmp_path, value_heads):
    config = gdn_config(tie_word_embeddings=False, num_v_heads=value_heads)
    model = build_stage_model(
        read_fla_config(config).model_config(), (0, 1), True, True, 0, torch.device("cpu"), torch.float32
    )
    perturb(model, 9)
    tensors = to_fla_tensors(dict(model.named_parameters()), model.config.layers)
    write_hf_directory(tmp_path / "model", tensors, config)
    assert main(["compile", str(_schedule(tmp_path, config, pipeline=2)), "-o", str(tmp_path / "train.py")]) == 0
    model_config = runpy.run_path(str(tmp_path / "train.py"))["MODEL"]
    first = build_stage_model(model_config, (0,), True, False, 123, torch.device("cpu"), torch.float64)
    last = build_stage_model(model_config, (1,), False, True, 456, torch.device("cpu"), torch.float64)
    tokens = torch.randint(0, config["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden, _ = first(tokens, [None])
        hidden, _ = last(hidden, [None])
        logits = last.logits(hidden)
    torch.testing.assert_close(logits, gdn_reference_logits(tensors, config, tokens), rtol=1e-9, atol=1e-9)


def test_a_written_conv_size_that_does_not_fit_the_weights_is_an_error_at_from(tmp_path):
    config = gdn_config()
    model = build_stage_model(
        read_fla_config(config).model_config(), (0, 1), True, True, 0, torch.device("cpu"), torch.float32
    )
    write_hf_directory(tmp_path / "model", to_fla_tensors(dict(model.named_parameters()), model.config.layers), config)
    ((line, column, text),) = _errors(_schedule(tmp_path, config, extra="\n  short_conv_size = 2"))
    assert (line, column) == (3, 10)
    assert "model.layers.0.attn.q_conv1d.weight has shape (16, 1, 4)" in text
