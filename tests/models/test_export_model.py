"""``schedlang export-model``: a checkpoint trained on two pipeline ranks, out as fla's directory and back in."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys

import pytest
import torch

from fla_reference import fla_config, import_fla, perturb, write_hf_directory
from schedlang.cli import main
from schedlang.runtime.hf_format import read_fla_config, to_fla_tensors
from schedlang.runtime.hf_weights import read_checkpoint_model
from schedlang.runtime.model import build_stage_model

pytest.importorskip("safetensors")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SCHEDULE = """schedule export_round_trip
model {{ from = hf("{directory}") }}
mesh {{ pipeline = {pipeline} }}
sequence {{ length = 32  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2 }}
train {{ steps = 2  optimizer = adamw(lr = 1e-2){train} }}
"""

CONFIG = fla_config(num_heads=2, num_kv_heads=1, clamp_min=-0.05, intermediate_size=48)


def _logits(model_config, tensors, tokens):
    model = build_stage_model(
        model_config, tuple(range(len(model_config.layers))), True, True, 0, torch.device("cpu"), torch.float32
    )
    if tensors is not None:
        model.load_state_dict(tensors)
    with torch.no_grad():
        hidden, _ = model(tokens, [None] * model.n_states)
        return model.logits(hidden)


def _trained_checkpoint(tmp_path):
    model = build_stage_model(read_fla_config(CONFIG).model_config(), (0, 1), True, True, 0, torch.device("cpu"), torch.float32)
    perturb(model, 2)
    initial = to_fla_tensors(dict(model.named_parameters()), model.config.layers)
    write_hf_directory(tmp_path / "start", initial, CONFIG)
    schedule = tmp_path / "train.sched"
    schedule.write_text(
        SCHEDULE.format(directory="start", pipeline=2, train='  checkpoint = "ckpt" every 2'), encoding="utf-8"
    )
    completed = subprocess.run(
        [sys.executable, "-m", "schedlang", "run", str(schedule)], capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stderr
    return initial


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A checkpoint of two training steps on two gloo pipeline ranks, exported to ``out``."""
    tmp_path = tmp_path_factory.mktemp("export")
    initial = _trained_checkpoint(tmp_path)
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 0
    return tmp_path, initial


@pytest.mark.slow
def test_two_rank_checkpoint_exports_and_loads_back_with_the_same_logits(exported):
    tmp_path, initial = exported
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "gla" and written["num_kv_heads"] == 1 and written["intermediate_size"] == 48
    assert read_fla_config(written) == read_fla_config(CONFIG)

    trained_config, trained = read_checkpoint_model(tmp_path / "ckpt" / "step-00000002")
    from safetensors.torch import load_file

    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(exported) == set(initial)
    assert any(not torch.equal(exported[name], initial[name]) for name in initial)  # it trained

    back = tmp_path / "back.sched"
    back.write_text(SCHEDULE.format(directory="out", pipeline=1, train=""), encoding="utf-8")
    assert main(["compile", str(back), "-o", str(tmp_path / "back.py")]) == 0
    loaded_config = runpy.run_path(str(tmp_path / "back.py"))["MODEL"]
    tokens = torch.randint(0, CONFIG["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(loaded_config, None, tokens), _logits(trained_config, trained, tokens), rtol=0, atol=0)


@pytest.mark.slow
def test_fla_loads_the_export_with_every_tensor(exported):
    from safetensors.torch import load_file

    import_fla("fla.models")
    transformers = pytest.importorskip("transformers")
    tmp_path, _ = exported
    exported_tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    fla_model, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = fla_model.state_dict()
    for name, tensor in exported_tensors.items():
        assert torch.equal(state[name], tensor), name


def test_an_existing_output_directory_is_kept_without_force(tmp_path, capsys):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 1
    assert "is not empty; give --force" in capsys.readouterr().err
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"


def test_a_directory_without_a_checkpoint_is_an_error(tmp_path, capsys):
    (tmp_path / "ckpt").mkdir()
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 1
    assert "holds no complete checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_model_fla_cannot_load_is_refused_with_the_reason(tmp_path):
    from schedlang.vocabulary import ModelConfig
    from schedlang.runtime.hf_weights import write_hf_directory as write

    with pytest.raises(ValueError, match="gate_low_rank_dim must be 16; .*output_gate must be swish"):
        write(tmp_path / "out", ModelConfig(vocab=8, d_model=4, layers=("gla",), heads=1, head_dim=4), {})


def test_the_run_record_holds_the_options_only_when_they_are_not_the_defaults():
    from schedlang.runtime.checkpoint_manifest import run_record
    from schedlang.runtime.config import PipelineConfig
    from schedlang.vocabulary import ModelConfig, TrainConfig
    from schedlang.runtime.hf_weights import model_config_of_record

    pipeline = PipelineConfig(((0, 1),), (0, 32), 1, 1, ((),))
    plain = ModelConfig(vocab=8, d_model=4, layers=("gla", "gla"), heads=1, head_dim=4)
    assert not any(key in run_record(plain, pipeline, TrainConfig(), (1, 1, 1)) for key in ("model.options", "model.norm_eps"))
    assert model_config_of_record(run_record(plain, pipeline, TrainConfig(), (1, 1, 1))) == plain
    fla_shaped = read_fla_config(CONFIG).model_config()
    record = run_record(fla_shaped, pipeline, TrainConfig(), (1, 1, 1))
    assert "model.options" in record and model_config_of_record(record) == fla_shaped


def _exported_gated_deltanet(tmp_path, **changes):
    """A perturbed fla-shaped Gated DeltaNet (``changes`` to its config) saved as a schedlang checkpoint and
    exported to ``out``: returns its fla config, its model config and the model."""
    from fla_gdn_reference import gdn_config

    from schedlang.runtime.checkpoint import save_checkpoint
    from schedlang.runtime.checkpoint_manifest import run_record
    from schedlang.runtime.config import PipelineConfig
    from schedlang.vocabulary import TrainConfig

    config = gdn_config(intermediate_size=48, conv_size=3, tie_word_embeddings=True, **changes)
    model_config = read_fla_config(config).model_config()
    ours = build_stage_model(model_config, (0, 1), True, True, 0, torch.device("cpu"), torch.float32)
    perturb(ours, 4)
    pipeline = PipelineConfig(((0, 1),), (0, 32), 1, 1, ((),))
    record = run_record(ours.config, pipeline, TrainConfig(), (1, 1, 1))
    save_checkpoint(str(tmp_path / "ckpt"), 1, ours, torch.optim.AdamW(ours.parameters()), record)
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 0
    return config, model_config, ours


GROUPED_VALUE_HEADS = [{}, {"num_v_heads": 4}]


@pytest.mark.parametrize("changes", GROUPED_VALUE_HEADS, ids=["num_v_heads=None", "num_v_heads=4"])
def test_a_gated_deltanet_checkpoint_exports_and_loads_back_with_the_same_logits(tmp_path, changes):
    """checkpoint -> export-model -> from = hf: fla's Gated DeltaNet config and names, the same logits; grouped
    value heads keep num_v_heads and the weights' shapes."""
    from safetensors.torch import load_file

    config, model_config, ours = _exported_gated_deltanet(tmp_path, **changes)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "gated_deltanet" and written["conv_size"] == 3 and written["head_dim"] == 8
    assert written["num_v_heads"] == changes.get("num_v_heads")
    assert read_fla_config(written) == read_fla_config(config)
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "model.layers.1.attn.v_conv1d.weight" in tensors and "lm_head.weight" not in tensors
    value_heads = changes.get("num_v_heads", config["num_heads"])
    assert tensors["model.layers.1.attn.v_proj.weight"].shape == (value_heads * 16, 32)
    assert tensors["model.layers.1.attn.q_proj.weight"].shape == (config["num_heads"] * 8, 32)
    assert tensors["model.layers.1.attn.A_log"].shape == (value_heads,)
    assert torch.equal(tensors["model.layers.1.attn.v_proj.weight"], ours.state_dict()["layers.1.mixer.v_proj.weight"])

    back = tmp_path / "back.sched"
    back.write_text(SCHEDULE.format(directory="out", pipeline=1, train=""), encoding="utf-8")
    assert main(["compile", str(back), "-o", str(tmp_path / "back.py")]) == 0
    loaded_config = runpy.run_path(str(tmp_path / "back.py"))["MODEL"]
    tokens = torch.randint(0, config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    expected = _logits(model_config, dict(ours.state_dict()), tokens)
    torch.testing.assert_close(_logits(loaded_config, None, tokens), expected, rtol=0, atol=0)


@pytest.mark.parametrize("changes", GROUPED_VALUE_HEADS, ids=["num_v_heads=None", "num_v_heads=4"])
def test_fla_loads_the_gated_deltanet_export_with_every_tensor(tmp_path, changes):
    from safetensors.torch import load_file

    import_fla("fla.models")
    transformers = pytest.importorskip("transformers")
    _exported_gated_deltanet(tmp_path, **changes)
    exported_tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    fla_model, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert type(fla_model).__name__ == "GatedDeltaNetForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = fla_model.state_dict()
    for name, tensor in exported_tensors.items():
        assert torch.equal(state[name], tensor), name


def test_a_gdn_model_fla_cannot_load_is_refused_with_the_reason(tmp_path):
    from schedlang.vocabulary import ModelConfig
    from schedlang.runtime.hf_weights import write_hf_directory as write

    refused = "Gated DeltaNet model: delta_gates must be mamba; short_conv_size must be set"
    with pytest.raises(ValueError, match=refused):
        write(tmp_path / "out", ModelConfig(vocab=8, d_model=4, layers=("gdn",), heads=1, head_dim=4), {})
    with pytest.raises(ValueError, match="rotary position embeddings"):
        write(tmp_path / "out", ModelConfig(vocab=8, d_model=4, layers=("gdn", "attn"), heads=1, head_dim=4), {})


def test_the_weights_file_gets_the_same_permissions_as_config_json(tmp_path):
    """safetensors creates its file 0600 whatever the umask; the export gives it config.json's mode."""
    import os
    import stat

    from schedlang.runtime.hf_weights import write_hf_directory as write

    model_config = read_fla_config(CONFIG).model_config()
    model = build_stage_model(model_config, (0, 1), True, True, 0, torch.device("cpu"), torch.float32)
    previous = os.umask(0o022)
    try:
        write(tmp_path / "out", model_config, dict(model.named_parameters()))
    finally:
        os.umask(previous)
    names = ("config.json", "model.safetensors")
    modes = {name: stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) for name in names}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}
