"""fla's ``Mamba3ForCausalLM`` directories: ``from = hf`` fills the model block and loads the weights (logits
against the float64 re-statement of fla's layer around mamba_ssm's step reference; fla's own layer only runs
mamba_ssm's CUDA kernels), refusals at the ``from`` value naming the field (``is_mimo`` first), and
``export-model`` back to a directory whose tensors fla's model loads strictly, with the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from fla_mamba3_reference import mamba3_logits
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
from schedlang.runtime.hf_format import read_fla_config
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import LayerKind, MlpKind

pytest.importorskip("safetensors")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SCHEDULE = """schedule from_hf_mamba3
model {{
  from = hf("model"){extra}
}}
mesh {{ pipeline = {pipeline} }}
sequence {{ length = 64  chunks = 2  kernel_chunk = 16 }}
pipeline {{ microbatches = 2 }}
train {{ steps = 1 }}
"""


def mamba3_config(**changes) -> dict:
    """A small Mamba3 config.json as fla 0.6.0's Mamba3Config writes it (its defaults, smaller sizes)."""
    config = {
        "model_type": "mamba3", "architectures": ["Mamba3ForCausalLM"], "vocab_size": 61, "hidden_size": 32,
        "num_hidden_layers": 2, "head_dim": 16, "num_heads": 4, "expand": 2, "state_size": 8, "n_groups": 1,
        "use_bias": False, "rope_fraction": 0.5, "A_floor": 1e-4, "is_outproj_norm": False, "is_mimo": False,
        "mimo_rank": 4, "hidden_act": "silu", "dt_min": 0.001, "dt_max": 0.1, "dt_init_floor": 1e-4,
        "norm_eps": 1e-5, "chunk_size": 64, "residual_in_fp32": True, "tie_word_embeddings": False,
    }
    config.update(changes)
    return config


def _schedule(tmp_path, config, extra="", pipeline=1, tensors=None):
    if tensors is None:
        (tmp_path / "model").mkdir(exist_ok=True)
        (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    else:
        write_hf_directory(tmp_path / "model", tensors, config)
    path = tmp_path / "s.sched"
    path.write_text(SCHEDULE.format(extra=extra, pipeline=pipeline), encoding="utf-8")
    return path


def test_the_directory_fills_the_model_block(tmp_path):
    config = mamba3_config(n_groups=2, use_bias=True, rope_fraction=1.0, A_floor=0.01, is_outproj_norm=True)
    model = load_program(_schedule(tmp_path, config)).model
    assert model.layers == (LayerKind.MAMBA3,) * 2 and (model.heads, model.head_dim) == (4, 16)
    assert model.mlp_kind is MlpKind.NONE and model.norm_eps == 1e-5
    mamba3 = model.options.mamba3
    assert (mamba3.state_size, mamba3.n_groups, mamba3.use_bias, mamba3.rope_fraction) == (8, 2, True, 1.0)
    assert (mamba3.A_floor, mamba3.is_outproj_norm, mamba3.is_mimo) == (0.01, True, False)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"is_mimo": True}, "is_mimo"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_fraction": 0.25}, "rope_fraction"),
        ({"n_groups": 3}, "n_groups"),
        ({"num_heads": 3}, "num_heads"),
        ({"expand": 1.5, "head_dim": 7}, "expand"),
        ({"A_floor": 0.0}, "A_floor"),
    ],
)
def test_what_schedlang_does_not_build_is_an_error_at_the_from_value_naming_the_field(tmp_path, changes, field):
    ((line, column, text),) = schedule_errors(_schedule(tmp_path, mamba3_config(**changes)))
    assert (line, column) == (3, 10)
    assert f"'{field}'" in text or f"{field} " in text


def test_a_schedule_asking_for_mimo_is_refused_at_the_key(tmp_path):
    ((line, column, text),) = schedule_errors(_schedule(tmp_path, mamba3_config(), extra="\n  is_mimo = true"))
    assert (line, column) == (4, 3) and "is_mimo" in text and "MIMO" in text


@pytest.mark.parametrize("pipeline", [1, 2])
def test_the_weights_give_the_logits_of_the_float64_restatement(tmp_path, pipeline):
    """Loaded on one or two stages (every stage reads its own tensors), float32 within 1e-5."""
    config = mamba3_config(n_groups=2, use_bias=True, is_outproj_norm=True)
    tensors = perturbed_fla_tensors(config)
    program = load_program(_schedule(tmp_path, config, pipeline=pipeline, tensors=tensors))
    tokens = torch.randint(0, config["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    hidden = tokens
    for stage, layers in enumerate(program.stage_layers):
        model = build_stage_model(program.model, layers, stage == 0, stage == len(program.stage_layers) - 1, 0,
                                  torch.device("cpu"), torch.float32)
        with torch.no_grad():
            hidden, _ = model(hidden, [None] * model.n_states)
    with torch.no_grad():
        logits = model.logits(hidden)
    assert relative_error(logits, mamba3_logits(tensors, config, tokens)) < 1e-5


def _fla_model(directory):
    """fla's Mamba3ForCausalLM from ``directory`` (its tensors loaded by name and shape)."""
    import_fla("fla.models")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)


def test_a_checkpoint_exports_to_a_directory_fla_loads_with_the_same_logits(tmp_path):
    """fla's model loads every exported tensor by name and shape (strictly); its forward needs CUDA and
    mamba_ssm, so the logits are checked against the float64 re-statement on the exported tensors."""
    from safetensors.torch import load_file

    from schedlang.runtime.checkpoint import save_checkpoint
    from schedlang.runtime.checkpoint_manifest import run_record
    from schedlang.runtime.config import PipelineConfig
    from schedlang.vocabulary import TrainConfig

    config = mamba3_config(rope_fraction=1.0, is_outproj_norm=True, tie_word_embeddings=True)
    model_config = read_fla_config(config).model_config()
    ours = build_stage_model(model_config, (0, 1), True, True, 0, torch.device("cpu"), torch.float32)
    perturb(ours, 4)
    pipeline = PipelineConfig(((0, 1),), (0, 32), 1, 1, ((),))
    record = run_record(ours.config, pipeline, TrainConfig(), (1, 1, 1))
    save_checkpoint(str(tmp_path / "ckpt"), 1, ours, torch.optim.AdamW(ours.parameters()), record)
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "mamba3" and written["expand"] == 2 and written["is_mimo"] is False
    assert read_fla_config(written) == read_fla_config(config)
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "backbone.layers.1.mixer.B_bias" in exported and "lm_head.weight" not in exported
    assert torch.equal(exported["backbone.layers.0.mixer.C_bias"], ours.state_dict()["layers.0.mixer.C_bias"])
    tokens = torch.randint(0, config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    expected = model_logits(model_config, tokens, dict(ours.state_dict()))
    assert relative_error(mamba3_logits(exported, written, tokens), expected) < 1e-5
    fla_model = _fla_model(tmp_path / "out")
    fla_state = fla_model.state_dict()
    for name, tensor in exported.items():
        assert torch.equal(fla_state[name], tensor), name
    fla_parameters = {name for name, _ in fla_model.named_parameters()}
    assert fla_parameters - {"lm_head.weight"} == set(exported), fla_parameters ^ set(exported)
