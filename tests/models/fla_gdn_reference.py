"""An independent float64 reference of flash-linear-attention 0.6.0's ``GatedDeltaNetForCausalLM`` forward.

Written from fla's layer semantics (fla/layers/gated_deltanet.py, fla/modules ShortConvolution and
FusedRMSNormGated, fla/models/gated_deltanet/), not from schedlang's model: it reads fla's config fields
and parameter names and runs everything one token at a time. Per layer, with ``W = conv_size``:

    q_t = silu(sum_j w_q[:, j] * q_proj(x)_{t - W + 1 + j})      (likewise k, v; zeros before the start)
    q_t, k_t = q_t / |q_t|, k_t / |k_t|                           (per head)
    g_t = -exp(A_log) * softplus(a_proj(x_t) + dt_bias),   beta_t = sigmoid(b_proj(x_t))
    S_t = exp(g_t) S_{t-1} + beta_t k_t^T (v_t - exp(g_t) k_t S_{t-1}),   o_t = (q_t / sqrt(head_dim)) S_t
    out_t = o_proj(rmsnorm_head(o_t) * w * silu(g_proj(x_t)))

per value head, with ``S`` of shape [head_dim, head_dim * expand_v]. With grouped value attention
(``num_v_heads``, a multiple of ``num_heads``) v, a, b, ``A_log``, ``dt_bias``, g and the state have
``num_v_heads`` heads and value head ``j`` reads q/k head ``j // (num_v_heads // num_heads)``, the index fla's
kernels use (``i_h // (HV // H)`` in fla/ops/gated_delta_rule/chunk_fwd.py and ``i_hv // (HV // H)`` in
fused_recurrent.py). Around it: pre-norm residual blocks, a SwiGLU MLP, a final
RMSNorm and the LM head (the embedding when tied). The layers of the config's ``attn`` spec are fla's
``Attention`` (``fla_reference.attention_layer``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fla_reference import attention_layer, attention_spec


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _short_convolution(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x`` [B, L, C], ``weight`` [C, 1, W]: token by token, tap ``W - 1`` on the current token."""
    size = weight.shape[-1]
    outputs = []
    for step in range(x.shape[1]):
        total = torch.zeros_like(x[:, 0])
        for tap in range(size):
            source = step - size + 1 + tap
            if source >= 0:
                total = total + weight[:, 0, tap] * x[:, source]
        outputs.append(F.silu(total))
    return torch.stack(outputs, dim=1)


def gdn_layer(t: dict[str, torch.Tensor], prefix: str, h: torch.Tensor, config: dict) -> torch.Tensor:
    """fla's ``GatedDeltaNet`` layer on the normed input ``h`` [B, L, d]; ``t`` float64 tensors by fla name."""
    batch, length, _ = h.shape
    heads, dk = config["num_heads"], config["head_dim"]
    value_heads = config.get("num_v_heads") or heads
    dv = round(dk * config["expand_v"])
    q, k, v = (
        _short_convolution(h @ t[prefix + f"{name}_proj.weight"].T, t[prefix + f"{name}_conv1d.weight"])
        for name in "qkv"
    )
    q = F.normalize(q.view(batch, length, heads, dk), dim=-1)
    k = F.normalize(k.view(batch, length, heads, dk), dim=-1)
    query_key_head = torch.arange(value_heads) // (value_heads // heads)  # of each value head, as fla's kernels
    q, k = q[:, :, query_key_head], k[:, :, query_key_head]
    v = v.view(batch, length, value_heads, dv)
    g = -t[prefix + "A_log"].exp() * F.softplus(h @ t[prefix + "a_proj.weight"].T + t[prefix + "dt_bias"])
    beta = torch.sigmoid(h @ t[prefix + "b_proj.weight"].T)
    state = h.new_zeros(batch, value_heads, dk, dv)
    outputs = []
    for step in range(length):
        decay = g[:, step].exp()[..., None, None]
        state = state * decay
        k_t, v_t, beta_t = k[:, step], v[:, step], beta[:, step][..., None]
        error = v_t - torch.einsum("bhk,bhkv->bhv", k_t, state)
        state = state + k_t[..., :, None] * (beta_t * error)[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, step] * dk**-0.5, state))
    o = torch.stack(outputs, dim=1)
    eps = config.get("norm_eps", 1e-6)
    gate = (h @ t[prefix + "g_proj.weight"].T).view(batch, length, value_heads, dv)
    o = _rms(o, t[prefix + "o_norm.weight"], eps) * F.silu(gate)
    return o.reshape(batch, length, value_heads * dv) @ t[prefix + "o_proj.weight"].T


def gdn_reference_logits(tensors: dict[str, torch.Tensor], config: dict, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, L, vocab] in float64 of fla's Gated DeltaNet with ``tensors`` (fla names) and ``config``."""
    t = {name: tensor.double() for name, tensor in tensors.items()}
    eps = config.get("norm_eps", 1e-6)
    x = t["model.embeddings.weight"][tokens]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        spec = attention_spec(config, layer)
        mixer = gdn_layer if spec is None else lambda t, prefix, h, config: attention_layer(t, prefix, h, spec)
        x = x + mixer(t, p + "attn.", _rms(x, t[p + "attn_norm.weight"], eps), config)
        h = _rms(x, t[p + "mlp_norm.weight"], eps)
        gate, up = h @ t[p + "mlp.gate_proj.weight"].T, h @ t[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T
    x = _rms(x, t["model.norm.weight"], eps)
    head = t["model.embeddings.weight"] if config.get("tie_word_embeddings") else t["lm_head.weight"]
    return x @ head.T


def gdn_config(**changes) -> dict:
    """A small Gated DeltaNet config.json as fla 0.6.0 writes it (its defaults, smaller sizes)."""
    config = {
        "model_type": "gated_deltanet",
        "architectures": ["GatedDeltaNetForCausalLM"],
        "vocab_size": 61,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 2,
        "num_v_heads": None,
        "head_dim": 8,
        "expand_v": 2.0,
        "hidden_ratio": 4,
        "intermediate_size": None,
        "hidden_act": "swish",
        "attn_mode": "chunk",
        "use_gate": True,
        "use_short_conv": True,
        "allow_neg_eigval": False,
        "conv_size": 4,
        "attn": None,
        "norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "output_gate_activation": "swish",
        "fuse_norm": True,
        "fuse_swiglu": True,
    }
    config.update(changes)
    return config
