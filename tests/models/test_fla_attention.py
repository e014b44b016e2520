"""schedlang's ``attn`` layer against flash-linear-attention's ``Attention`` (fla/layers/attn.py), and fla's
GLA and Gated DeltaNet hybrids (their ``attn`` config field) in and out of schedlang.

fla's layer runs here with the reference ``flash_attn`` stand-in (``flash_attn_standin``, registered by this
folder's conftest). Its ``RotaryEmbedding`` applies the rotation with a Triton kernel that needs a GPU driver
even under TRITON_INTERPRET=1, so on the CPU the layer's ``rotary`` is wrapped: the wrapper builds fla's own
cosine and sine tables (``RotaryEmbedding._update_cos_sin_cache``, plain torch) and applies the rotate-half
formula to them in float64 (complex products), which is what fla's kernel computes. The GPU variant runs fla's
layer untouched, kernel included.
"""

from __future__ import annotations

import json
import runpy

import pytest
import torch
from torch import nn

from fla_reference import import_fla, perturb
from schedlang.cli import main
from schedlang.runtime.hf_format import fla_sources, read_fla_config
from schedlang.runtime.kv_buffers import AttentionChunk, ChunkPosition, SequenceKV
from schedlang.runtime.mixer_attention import CausalAttentionMixer
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import AttentionOptions, LayerKind, ModelConfig, ModelOptions

pytest.importorskip("safetensors")
pytestmark = pytest.mark.filterwarnings("ignore")

HIDDEN, HEADS, KV_HEADS, THETA = 32, 4, 2, 500.0


class TablesOfFlaWithTheFormula(nn.Module):
    """fla's ``RotaryEmbedding`` tables, the rotate-half formula applied in float64 (see the module docstring)."""

    def __init__(self, rotary) -> None:
        super().__init__()
        self.rotary = rotary

    def forward(self, q, k, seqlen_offset=0, max_seqlen=None, cu_seqlens=None, **unused):
        assert cu_seqlens is None and isinstance(seqlen_offset, int)
        length = q.shape[1]
        self.rotary._update_cos_sin_cache(max_seqlen or seqlen_offset + length, device=q.device, dtype=q.dtype)
        cosine = self.rotary._cos_cached[seqlen_offset : seqlen_offset + length].double()
        sine = self.rotary._sin_cached[seqlen_offset : seqlen_offset + length].double()

        def rotate(tensor):
            half = tensor.shape[-1] // 2
            pairs = torch.complex(tensor[..., :half].double(), tensor[..., half:].double())
            turned = pairs * torch.complex(cosine, sine)[None, :, None, :]
            return torch.cat((turned.real, turned.imag), dim=-1).to(tensor.dtype)

        return rotate(q), rotate(k)


def _fla_attention(dtype, device):
    layers = import_fla("fla.layers.attn")
    attention = layers.Attention(
        hidden_size=HIDDEN, num_heads=HEADS, num_kv_heads=KV_HEADS, qkv_bias=True, rope_theta=THETA, layer_idx=0
    )
    with torch.no_grad():
        for parameter in attention.parameters():
            generator = torch.Generator().manual_seed(parameter.numel())
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    attention = attention.to(device=device, dtype=dtype)
    if device == "cpu":
        attention.rotary = TablesOfFlaWithTheFormula(attention.rotary)
    return attention


def _schedlang_attention(fla_attention, dtype, device):
    options = AttentionOptions(
        heads=HEADS, head_dim=HIDDEN // HEADS, kv_heads=KV_HEADS, qkv_bias=True, rope_theta=THETA
    )
    config = ModelConfig(
        vocab=8, d_model=HIDDEN, layers=("attn",), heads=1, head_dim=1, options=ModelOptions(attention=options)
    )
    mixer = CausalAttentionMixer(config)
    missing, unexpected = mixer.load_state_dict(fla_attention.state_dict(), strict=False)
    assert not missing and not unexpected  # fla's names are schedlang's: q_proj, k_proj, v_proj, o_proj (+ biases)
    return mixer.to(device=device, dtype=dtype)


def _both_outputs(dtype, device, length=40, bounds=(0, 13, 29, 40)):
    fla_attention = _fla_attention(dtype, device)
    ours = _schedlang_attention(fla_attention, dtype, device)
    hidden = torch.randn(2, length, HIDDEN, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    with torch.no_grad():
        expected = fla_attention(hidden)[0]
        whole = ours(hidden, None)[0]
        kv, pieces = SequenceKV(length), []
        for start, end in zip(bounds, bounds[1:]):
            chunk = AttentionChunk(ChunkPosition(kv, 0, start, end), layer=0)
            pieces.append(ours(hidden[:, start:end], chunk)[0])
    return expected, whole, torch.cat(pieces, dim=1)


def test_attn_layer_with_rope_is_fla_attention_on_the_cpu_in_float64():
    expected, whole, chunked = _both_outputs(torch.float64, "cpu")
    torch.testing.assert_close(whole, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(chunked, expected, rtol=0, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_gpu_attn_layer_with_rope_is_fla_attention_with_its_rotary_kernel(dtype, tolerance):
    """fla's layer untouched (its Triton rotary kernel; the stand-in flash_attn), on a CUDA device."""
    expected, whole, chunked = _both_outputs(dtype, "cuda", length=512, bounds=(0, 128, 320, 512))
    scale = expected.float().abs().max()
    assert (whole.float() - expected.float()).abs().max() <= tolerance * scale
    assert (chunked.float() - expected.float()).abs().max() <= tolerance * scale


HYBRID_GLA = dict(
    vocab_size=97, hidden_size=32, num_heads=2, num_kv_heads=1, num_hidden_layers=3, intermediate_size=48,
    attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2, "qkv_bias": True, "rope_theta": THETA},
)
HYBRID_GDN = dict(
    vocab_size=97, hidden_size=32, num_heads=2, head_dim=8, expand_v=2.0, num_hidden_layers=3, intermediate_size=48,
    attn={"layers": [1], "num_heads": 2},
)


def _saved_fla_hybrid(directory, architecture, sizes):
    pytest.importorskip("transformers")
    fla_models = import_fla("fla.models")
    config = getattr(fla_models, f"{architecture}Config")(fuse_cross_entropy=False, **sizes)
    model = getattr(fla_models, f"{architecture}ForCausalLM")(config).float()
    perturb(model, 0)
    model.save_pretrained(str(directory))
    return model


@pytest.mark.parametrize("architecture, sizes", [("GLA", HYBRID_GLA), ("GatedDeltaNet", HYBRID_GDN)])
def test_an_fla_hybrid_loads_as_attn_layers_and_exports_back_with_every_tensor(tmp_path, architecture, sizes):
    """fla saves a hybrid; ``from = hf`` builds attn at layer 1 and loads every tensor; a schedlang checkpoint
    of it exported with ``export-model`` loads into fla's class with no missing or unexpected keys, equal."""
    from safetensors.torch import load_file

    from schedlang.runtime.checkpoint import save_checkpoint
    from schedlang.runtime.checkpoint_manifest import run_record
    from schedlang.runtime.config import PipelineConfig
    from schedlang.vocabulary import TrainConfig

    transformers = pytest.importorskip("transformers")
    fla_model = _saved_fla_hybrid(tmp_path / "fla", architecture, sizes)
    written = json.loads((tmp_path / "fla" / "config.json").read_text())
    model = read_fla_config(written)
    assert model.layers[1] is LayerKind.ATTN and LayerKind.ATTN not in (model.layers[0], model.layers[2])
    schedule = tmp_path / "hybrid.sched"
    schedule.write_text(
        f'schedule hybrid\nmodel {{ from = hf("{tmp_path / "fla"}") }}\nsequence {{ length = 128  chunks = 2 }}\n'
        "pipeline { microbatches = 1 }\n",
        encoding="utf-8",
    )
    assert main(["compile", str(schedule), "-o", str(tmp_path / "train.py")]) == 0
    config = runpy.run_path(str(tmp_path / "train.py"))["MODEL"]
    assert config.options.attention == model.options.attention
    ours = build_stage_model(config, (0, 1, 2), True, True, 0, torch.device("cpu"), torch.float32)
    fla_state = fla_model.state_dict()
    for name, parameter in ours.named_parameters():
        sources = fla_sources(name, config.layers)
        torch.testing.assert_close(parameter, torch.cat([fla_state[source] for source in sources]), rtol=0, atol=0)

    perturb(ours, 3)
    pipeline = PipelineConfig(((0, 1, 2),), (0, 32), 1, 1, ((),))
    record = run_record(ours.config, pipeline, TrainConfig(), (1, 1, 1))
    save_checkpoint(str(tmp_path / "ckpt"), 1, ours, torch.optim.AdamW(ours.parameters()), record)
    assert main(["export-model", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")]) == 0
    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported["attn"]["layers"] == [1] and read_fla_config(exported) == read_fla_config(written)
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert type(loaded).__name__ == f"{architecture}ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = loaded.state_dict()
    exported_tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "model.layers.1.attn.q_proj.bias" in exported_tensors or not sizes["attn"].get("qkv_bias")
    assert sorted(exported_tensors) == sorted(name for name in state if name in fla_state)
    for name, tensor in exported_tensors.items():
        assert torch.equal(state[name], tensor), name
