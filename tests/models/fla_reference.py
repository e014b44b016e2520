"""An independent float64 reference of flash-linear-attention 0.6.0's ``GLAForCausalLM`` forward, and helpers.

Written from fla's layer semantics (fla/layers/gla.py, fla/models/gla/modeling_gla.py, fla/modules), not
from schedlang's model: it reads fla's config fields and fla's parameter names, and runs the recurrence one
token at a time,

    gk_t = max(logsigmoid(gk_proj(x_t)) / 16, clamp_min),   S_t = diag(exp(gk_t)) S_{t-1} + k_t^T v_t,
    o_t = (q_t / sqrt(head_k_dim)) S_t,   out_t = o_proj(rmsnorm_head(o_t) * w * silu(g_proj(x_t))),

with key/value/gate heads repeated for their query heads, pre-norm residual blocks, a SwiGLU MLP
``down(silu(gate(x)) * up(x))``, a final RMSNorm and the LM head (the embedding when tied). The layers the
config's ``attn`` spec lists are fla's ``Attention`` (fla/layers/attn.py, fla/modules/rotary), token ``p``'s
query and key rotated half against half by the angles ``p * rope_theta ** (-2 i / D)`` (float32, as fla's
``RotaryEmbedding`` computes them and their cosine and sine), then causal softmax attention over ``D = hidden_size // num_heads``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from benchmarks.installed import import_installed


def import_fla(name: str):
    """fla's module ``name``, imported from the installed packages (benchmarks/installed.py: a checkout's own
    ``kernels`` would shadow the package transformers imports). The test is skipped only where
    flash-linear-attention is not installed; any other ImportError fails it, as a broken import should."""
    if importlib.util.find_spec("fla") is None:
        pytest.skip("flash-linear-attention is not installed")
    return import_installed(name)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def fla_widths(config: dict) -> tuple[int, int, int, int]:
    """(heads, kv_heads, key width per head, value width per head)."""
    heads = config["num_heads"]
    kv_heads = config.get("num_kv_heads") or heads
    d = config["hidden_size"]
    return heads, kv_heads, round(d * config["expand_k"]) // heads, round(d * config["expand_v"]) // heads


def attention_spec(config: dict, layer: int) -> dict | None:
    """The ``attn`` spec of the config that lists ``layer``, or None (the layer is the model's own mixer)."""
    specs = config.get("attn") or []
    for spec in [specs] if isinstance(specs, dict) else specs:
        if layer in spec["layers"]:
            return spec
    return None


def attention_layer(t: dict[str, torch.Tensor], prefix: str, h: torch.Tensor, spec: dict) -> torch.Tensor:
    """fla's ``Attention`` with rotary embeddings on the normed input ``h`` [B, L, d], by the formula."""
    batch, length, width = h.shape
    heads = spec["num_heads"]
    kv_heads = spec.get("num_kv_heads") or heads
    dim = width // heads

    def project(name: str, count: int) -> torch.Tensor:
        out = h @ t[prefix + f"{name}_proj.weight"].T
        if spec.get("qkv_bias"):
            out = out + t[prefix + f"{name}_proj.bias"]
        return out.view(batch, length, count, dim)

    theta = float(spec.get("rope_theta", 10000.0))
    inverse = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inverse)
    cosine, sine = (table.double()[None, :, None, :] for table in (angles.cos(), angles.sin()))

    def rotate(x: torch.Tensor) -> torch.Tensor:
        first, second = x[..., : dim // 2], x[..., dim // 2 :]
        return torch.cat((first * cosine - second * sine, first * sine + second * cosine), -1)

    groups = heads // kv_heads
    q = rotate(project("q", heads))
    k = rotate(project("k", kv_heads)).repeat_interleave(groups, 2)
    v = project("v", kv_heads).repeat_interleave(groups, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / dim**0.5
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    o = torch.einsum("bhqk,bkhd->bqhd", weights, v)
    return o.reshape(batch, length, heads * dim) @ t[prefix + "o_proj.weight"].T


def reference_logits(tensors: dict[str, torch.Tensor], config: dict, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, L, vocab] in float64 of fla's GLA with ``tensors`` (fla names) and ``config`` (config.json)."""
    t = {name: tensor.double() for name, tensor in tensors.items()}
    heads, kv_heads, dk, dv = fla_widths(config)
    groups = heads // kv_heads
    eps = config.get("norm_eps", 1e-6)
    clamp_min = config.get("clamp_min")
    batch, length = tokens.shape
    x = t["model.embeddings.weight"][tokens]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        spec = attention_spec(config, layer)
        if spec is not None:
            x = x + attention_layer(t, p + "attn.", h, spec)
            h = _rms(x, t[p + "mlp_norm.weight"], eps)
            gate, up = h @ t[p + "mlp.gate_proj.weight"].T, h @ t[p + "mlp.up_proj.weight"].T
            x = x + (F.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T
            continue
        q = (h @ t[p + "attn.q_proj.weight"].T).view(batch, length, heads, dk)
        k = (h @ t[p + "attn.k_proj.weight"].T).view(batch, length, kv_heads, dk).repeat_interleave(groups, 2)
        v = (h @ t[p + "attn.v_proj.weight"].T).view(batch, length, kv_heads, dv).repeat_interleave(groups, 2)
        gk = (h @ t[p + "attn.gk_proj.0.weight"].T) @ t[p + "attn.gk_proj.1.weight"].T + t[p + "attn.gk_proj.1.bias"]
        gk = F.logsigmoid(gk.view(batch, length, kv_heads, dk).repeat_interleave(groups, 2)) / 16
        if clamp_min is not None:
            gk = gk.clamp_min(clamp_min)
        state = x.new_zeros(batch, heads, dk, dv)
        outputs = []
        for step in range(length):
            state = state * gk[:, step].exp()[..., None] + k[:, step, :, :, None] * v[:, step, :, None, :]
            outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, step] * dk**-0.5, state))
        o = torch.stack(outputs, dim=1)
        norm_weight = t.get(p + "attn.g_norm_swish_gate.weight", t.get(p + "attn.g_norm.weight"))
        o = _rms(o, norm_weight, eps) * F.silu((h @ t[p + "attn.g_proj.weight"].T).view(batch, length, heads, dv))
        x = x + o.reshape(batch, length, heads * dv) @ t[p + "attn.o_proj.weight"].T
        h = _rms(x, t[p + "mlp_norm.weight"], eps)
        gate, up = h @ t[p + "mlp.gate_proj.weight"].T, h @ t[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T
    x = _rms(x, t["model.norm.weight"], eps)
    head = t["model.embeddings.weight"] if config.get("tie_word_embeddings") else t["lm_head.weight"]
    return x @ head.T


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter away from its initial value (norm weights off 1, biases off 0), so that a wrong
    name or a missing term changes the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in sorted(model.named_parameters()):
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.add_((0.3 if parameter.dim() == 1 else 0.05) * noise.to(parameter.device, parameter.dtype))


def write_hf_directory(directory: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """``config.json`` and ``model.safetensors`` as ``save_pretrained`` writes them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")


def fla_config(**changes) -> dict:
    """A small GLA config.json as fla 0.6.0 writes it (its defaults, smaller sizes)."""
    config = {
        "model_type": "gla",
        "architectures": ["GLAForCausalLM"],
        "vocab_size": 61,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 2,
        "num_kv_heads": None,
        "expand_k": 0.5,
        "expand_v": 1.0,
        "hidden_ratio": 4,
        "intermediate_size": None,
        "hidden_act": "swish",
        "use_output_gate": True,
        "use_short_conv": False,
        "feature_map": None,
        "clamp_min": None,
        "elementwise_affine": True,
        "norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "fuse_norm": True,
        "fuse_swiglu": True,
    }
    config.update(changes)
    return config


def schedule_errors(path) -> list[tuple[int, int, str]]:
    """(line, column, message) of each diagnostic loading the schedule at ``path`` raises; fails if none."""
    import pytest

    from schedlang.diagnostics import ScheduleError
    from schedlang.frontend import load_program

    with pytest.raises(ScheduleError) as raised:
        load_program(path)
    return [(d.span.line, d.span.column, d.message) for d in raised.value.diagnostics]


def schedlang_model(model_config, tensors: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """The whole model of ``model_config`` on one CPU stage in float32, with ``tensors`` (schedlang's names)
    loaded when given."""
    from schedlang.runtime.model import build_stage_model

    model = build_stage_model(model_config, tuple(range(len(model_config.layers))), True, True, 0,
                              torch.device("cpu"), torch.float32)
    if tensors is not None:
        model.load_state_dict(tensors)
    return model


def perturbed_fla_tensors(config: dict, seed: int = 3) -> dict[str, torch.Tensor]:
    """Random weights of the fla ``config`` in fla's names (every parameter moved off its initial value)."""
    from schedlang.runtime.hf_format import read_fla_config, to_fla_tensors

    model = schedlang_model(read_fla_config(config).model_config())
    perturb(model, seed)
    return to_fla_tensors(dict(model.named_parameters()), model.config.layers)


def model_logits(model_config, tokens: torch.Tensor, tensors: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """:func:`schedlang_model`'s logits for ``tokens``."""
    model = schedlang_model(model_config, tensors)
    with torch.no_grad():
        hidden, _ = model(tokens, [None] * model.n_states)
        return model.logits(hidden)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()
