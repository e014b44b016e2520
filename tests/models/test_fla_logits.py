"""Against flash-linear-attention itself: a GLAForCausalLM or GatedDeltaNetForCausalLM saved by fla, loaded by
schedlang, and back.

Each test skips when fla or transformers is missing, or when fla's model cannot run here (on a CPU its
Triton kernels need a driver even under TRITON_INTERPRET=1, so the CPU test skips there and says why).
Every GPU model is a hybrid (fla's ``Attention`` with rotary embeddings at layer 1, run with the reference
``flash_attn`` stand-in that this folder's conftest registers). The GPU tests are the acceptance check of
docs/models.md; run them on a CUDA machine with
``pip install -e '.[test,fla]' /path/to/fla_core*.whl /path/to/flash_linear_attention*.whl`` and
``python -m pytest -q tests/models/test_fla_logits.py``.
"""

from __future__ import annotations

import json
import runpy

import pytest
import torch

from fla_reference import import_fla, perturb
from schedlang.cli import main
from schedlang.runtime.model import build_stage_model

pytest.importorskip("safetensors")
pytestmark = pytest.mark.filterwarnings("ignore")

SCHEDULE = """schedule fla_logits
model {{ from = hf("{directory}") }}
sequence {{ length = 128  chunks = 2 }}
pipeline {{ microbatches = 1 }}
"""


def _fla_model(directory, architecture="GLA", **sizes):
    """A randomly initialised (then perturbed) fla ``{architecture}ForCausalLM`` in float32, saved with
    save_pretrained."""
    pytest.importorskip("transformers")
    fla_models = import_fla("fla.models")
    config = getattr(fla_models, f"{architecture}Config")(fuse_cross_entropy=False, **sizes)
    model = getattr(fla_models, f"{architecture}ForCausalLM")(config).float()
    perturb(model, 0)
    model.save_pretrained(str(directory))
    return model


def _schedlang_model(tmp_path, directory, device, dtype):
    schedule = tmp_path / "fla.sched"
    schedule.write_text(SCHEDULE.format(directory=directory), encoding="utf-8")
    assert main(["compile", str(schedule), "-o", str(tmp_path / "fla_train.py")]) == 0
    model_config = runpy.run_path(str(tmp_path / "fla_train.py"))["MODEL"]
    layers = tuple(range(len(model_config.layers)))
    return build_stage_model(model_config, layers, True, True, 0, torch.device(device), dtype)


def _schedlang_logits(model, tokens):
    with torch.no_grad():
        hidden, _ = model(tokens, [None] * model.n_states)
        return model.logits(hidden).float()


def _fla_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


SIZES = dict(vocab_size=97, hidden_size=64, num_heads=2, num_hidden_layers=2, num_kv_heads=1, clamp_min=-0.05)


GDN_SIZES = dict(vocab_size=97, hidden_size=64, num_heads=2, head_dim=16, expand_v=2.0, num_hidden_layers=2)
HYBRID = dict(num_hidden_layers=3, attn={"layers": [1], "num_heads": 2, "num_kv_heads": 1, "rope_theta": 10000.0})
ARCHITECTURES = {
    "GLA": ("GLA", SIZES),
    "GatedDeltaNet": ("GatedDeltaNet", GDN_SIZES),
    "GLA_hybrid": ("GLA", {**SIZES, **HYBRID}),
    "GatedDeltaNet_hybrid": ("GatedDeltaNet", {**GDN_SIZES, **HYBRID}),
    "GatedDeltaNet_gva": ("GatedDeltaNet", {**GDN_SIZES, "num_v_heads": 4}),  # grouped value heads
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_fla_logits_on_the_cpu_in_float32(tmp_path, name):
    """The hybrids' attn layer (fla's Attention at layer 1) runs with the reference flash_attn stand-in."""
    architecture, sizes = ARCHITECTURES[name]
    fla_model = _fla_model(tmp_path / "fla", architecture, **sizes)
    tokens = torch.randint(0, sizes["vocab_size"], (2, 128), generator=torch.Generator().manual_seed(0))
    try:
        expected = _fla_logits(fla_model, tokens)
    except Exception as error:  # noqa: BLE001 - whatever stops fla's kernels here is a reason to skip
        pytest.skip(f"fla's {architecture}ForCausalLM does not run on this machine: {str(error).splitlines()[0][:120]}")
    schedlang_model = _schedlang_model(tmp_path, tmp_path / "fla", "cpu", torch.float32)
    torch.testing.assert_close(_schedlang_logits(schedlang_model, tokens), expected, rtol=1e-4, atol=1e-4)


GPU_HYBRID = dict(attn={"layers": [1], "num_heads": 8, "num_kv_heads": 2, "qkv_bias": True, "rope_theta": 10000.0})
GPU_SIZES = dict(vocab_size=1000, hidden_size=512, num_heads=4, num_hidden_layers=3, clamp_min=None, **GPU_HYBRID)
GDN_GPU_SIZES = dict(
    vocab_size=1000, hidden_size=512, num_heads=4, head_dim=64, expand_v=2.0, num_hidden_layers=3, **GPU_HYBRID
)
GPU_ARCHITECTURES = {  # hybrids: fla's Attention at layer 1
    "GLA": ("GLA", GPU_SIZES),
    "GatedDeltaNet": ("GatedDeltaNet", GDN_GPU_SIZES),
    "GatedDeltaNet_gva": ("GatedDeltaNet", {**GDN_GPU_SIZES, "num_v_heads": 8}),  # grouped value heads
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(GPU_ARCHITECTURES))
def test_gpu_fla_saved_schedlang_loaded_bf16_logits_within_tolerance(tmp_path, name):
    architecture, sizes = GPU_ARCHITECTURES[name]
    fla_model = _fla_model(tmp_path / "fla", architecture, **sizes).cuda()
    tokens = torch.randint(0, sizes["vocab_size"], (2, 512), generator=torch.Generator().manual_seed(0)).cuda()
    exact = _fla_logits(fla_model, tokens)
    fla_bf16 = _fla_logits(fla_model.to(torch.bfloat16), tokens)
    ours_fp32 = _schedlang_logits(_schedlang_model(tmp_path, tmp_path / "fla", "cuda", torch.float32), tokens)
    ours_bf16 = _schedlang_logits(_schedlang_model(tmp_path, tmp_path / "fla", "cuda", torch.bfloat16), tokens)
    scale = exact.abs().max()
    assert (ours_fp32 - exact).abs().max() <= 5e-3 * scale  # fla's and schedlang's kernels may use TF32
    fla_error, our_error = (fla_bf16 - exact).abs().max(), (ours_bf16 - exact).abs().max()
    assert our_error <= 2 * fla_error + 1e-2 * scale, (our_error, fla_error, scale)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "name, model_type", [("GLA", "gla"), ("GatedDeltaNet", "gated_deltanet"), ("GatedDeltaNet_gva", "gated_deltanet")]
)
def test_gpu_schedlang_checkpoint_exported_and_loaded_by_fla_matches(tmp_path, name, model_type):
    from schedlang.runtime.checkpoint import save_checkpoint
    from schedlang.runtime.checkpoint_manifest import run_record
    from schedlang.runtime.config import PipelineConfig
    from schedlang.vocabulary import TrainConfig

    transformers = pytest.importorskip("transformers")
    architecture, sizes = GPU_ARCHITECTURES[name]
    _fla_model(tmp_path / "fla", architecture, **sizes)
    ours = _schedlang_model(tmp_path, tmp_path / "fla", "cuda", torch.float32)
    perturb(ours, 5)  # no longer the weights fla saved
    pipeline = PipelineConfig(((0, 1, 2),), (0, 128), 1, 1, ((),))
    record = run_record(ours.config, pipeline, TrainConfig(), (1, 1, 1))
    save_checkpoint(str(tmp_path / "ckpt"), 1, ours, torch.optim.AdamW(ours.parameters()), record)
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == model_type and written.get("num_v_heads") == sizes.get("num_v_heads")
    fla_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).cuda().float()
    tokens = torch.randint(0, sizes["vocab_size"], (2, 512), generator=torch.Generator().manual_seed(1)).cuda()
    expected = _schedlang_logits(ours, tokens)
    scale = expected.abs().max()
    assert (_fla_logits(fla_model, tokens) - expected).abs().max() <= 5e-3 * scale
