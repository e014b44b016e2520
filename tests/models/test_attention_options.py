"""The ``attn`` layer's model keys (``attn_heads``, ``attn_head_dim``, ``attn_kv_heads``, ``qkv_bias``,
``rope_theta``): their checks with exact positions, their way into the generated script, the run record, and
the hybrid GLA ``config.json`` that gives them."""

from __future__ import annotations

import json
import runpy
from dataclasses import replace

import pytest

from fla_reference import fla_config
from schedlang.cli import main
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program
from schedlang.runtime.hf_format import UnsupportedFlaConfig, fla_config_problems, read_fla_config
from schedlang.vocabulary import AttentionOptions, LayerKind, ModelOptions

SCHEDULE = """schedule attention_keys
model {{
  vocab = 64  d_model = 32  heads = 2  head_dim = 16  layers = [gla, attn]
  {keys}
}}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2 }}
"""


def _path(tmp_path, keys: str):
    path = tmp_path / "s.sched"
    path.write_text(SCHEDULE.format(keys=keys), encoding="utf-8")
    return path


def _errors(path) -> list[tuple[int, int, str]]:
    with pytest.raises(ScheduleError) as raised:
        load_program(path)
    return [(d.span.line, d.span.column, d.message) for d in raised.value.diagnostics]


def test_the_keys_build_the_attention_options(tmp_path):
    keys = "attn_heads = 4  attn_head_dim = 8  attn_kv_heads = 2  qkv_bias = true  rope_theta = 1e4"
    model = load_program(_path(tmp_path, keys)).model
    attention = AttentionOptions(heads=4, head_dim=8, kv_heads=2, qkv_bias=True, rope_theta=10000.0)
    assert model.options.attention == attention
    assert load_program(_path(tmp_path, "")).model.options.attention == AttentionOptions()
    assert load_program(_path(tmp_path, "rope_theta = none")).model.options.attention == AttentionOptions()


def test_kv_heads_that_do_not_divide_the_attention_heads_are_an_error_at_the_key(tmp_path):
    assert _errors(_path(tmp_path, "attn_heads = 4  attn_kv_heads = 3")) == [
        (4, 19, "attn_kv_heads = 3 must divide the attn layers' 4 heads: each key/value head serves "
         "attn_heads / attn_kv_heads query heads")
    ]
    assert _errors(_path(tmp_path, "attn_kv_heads = 3"))[0][:2] == (4, 3)  # against heads = 2


def test_rope_with_an_odd_head_width_is_an_error_at_rope_theta(tmp_path):
    assert _errors(_path(tmp_path, "attn_head_dim = 7  rope_theta = 10000")) == [
        (4, 22, "rope_theta rotates pairs of channels, but the attn layers' head width is 7, which is odd")
    ]
    load_program(_path(tmp_path, "attn_head_dim = 7"))  # no rope: any width


def test_a_bad_rope_theta_is_an_error_at_its_value(tmp_path):
    assert _errors(_path(tmp_path, "rope_theta = 0")) == [(4, 16, "'model.rope_theta' must be > 0, found 0")]


def test_the_generated_script_writes_the_options_only_when_set(tmp_path):
    script = tmp_path / "train.py"
    assert main(["compile", str(_path(tmp_path, "attn_kv_heads = 1  rope_theta = 500")), "-o", str(script)]) == 0
    text = script.read_text()
    assert "attention=AttentionOptions(kv_heads=1, rope_theta=500.0)" in text
    assert runpy.run_path(str(script))["MODEL"].options.attention == AttentionOptions(kv_heads=1, rope_theta=500.0)
    assert main(["compile", str(_path(tmp_path, "")), "-o", str(script)]) == 0
    assert "AttentionOptions" not in script.read_text()


def test_the_run_record_holds_the_attention_options_only_when_set():
    options = ModelOptions(attention=AttentionOptions(heads=4, kv_heads=2, qkv_bias=True, rope_theta=10000.0))
    record = options.architecture_record()
    assert ("attention.rope_theta", 10000.0) in record
    assert ModelOptions.from_architecture_record(record) == options
    assert not any(name.startswith("attention.") for name, _ in ModelOptions().architecture_record())
    assert ModelOptions.from_architecture_record(ModelOptions().architecture_record()) == ModelOptions()


def test_a_hybrid_gla_config_gives_attn_layers_and_their_keys(tmp_path):
    config = fla_config(num_hidden_layers=3, attn={"layers": [0, 2], "num_heads": 4, "num_kv_heads": 1})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    schedule = tmp_path / "hybrid.sched"
    schedule.write_text(
        'schedule hybrid\nmodel { from = hf("model") }\nsequence { length = 64  chunks = 2  kernel_chunk = 16 }\n'
        "pipeline { microbatches = 2 }\n",
        encoding="utf-8",
    )
    model = load_program(schedule).model
    assert model.layers == (LayerKind.ATTN, LayerKind.GLA, LayerKind.ATTN)
    attention = AttentionOptions(heads=4, head_dim=8, kv_heads=1, qkv_bias=False, rope_theta=10000.0)
    assert model.options.attention == attention
    assert not fla_config_problems(read_fla_config(config).model_config())


@pytest.mark.parametrize(
    "attn, message",
    [
        ({"layers": [1], "num_heads": 2, "window_size": 16}, "'window_size' = 16 selects sliding-window attention"),
        ({"layers": [1], "num_heads": 2, "qk_norm": True}, "'qk_norm' = True selects RMS-normalised queries and keys"),
        ({"layers": [5], "num_heads": 2}, "'layers' must list layer indices in 0 .. 1"),
        ({"layers": [1], "num_heads": 3}, "hidden_size = 32 over num_heads = 3 must be a whole, even head width"),
        ({"layers": [1], "num_heads": 4, "num_kv_heads": 3}, "num_kv_heads = 3 does not divide num_heads = 4"),
        ({"layers": [1], "num_heads": 2, "rope_theta": -1}, "'rope_theta' must be a positive number"),
        ({"layers": [1], "num_heads": 2, "sliding": 1}, "unknown attention spec field(s) 'sliding'"),
        ([{"layers": [0], "num_heads": 2}, {"layers": [0], "num_heads": 2}], "a layer is listed twice"),
    ],
)
def test_what_schedlang_does_not_build_in_an_attn_spec_is_refused_naming_it(attn, message):
    with pytest.raises(UnsupportedFlaConfig, match="config field 'attn'") as raised:
        read_fla_config(fla_config(attn=attn))
    assert message in str(raised.value)


def test_export_needs_rope_and_fla_s_head_width():
    model = read_fla_config(fla_config(num_hidden_layers=2, attn={"layers": [1], "num_heads": 2})).model_config()
    assert not fla_config_problems(model)
    no_rope = ModelOptions(gla=model.options.gla, mlp_width=model.options.mlp_width)
    problems = fla_config_problems(replace(model, options=no_rope))
    assert problems == ["attn layers need rope_theta (fla's Attention always applies rotary position embeddings)"]
    narrow = replace(model.options, attention=replace(model.options.attention, head_dim=8))
    problems = fla_config_problems(replace(model, options=narrow))
    assert "attn layers need attn_heads * attn_head_dim = d_model" in problems[0]
