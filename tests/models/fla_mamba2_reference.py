"""An independent float64 re-statement of flash-linear-attention's ``Mamba2`` layer and ``Mamba2ForCausalLM``.

Written from fla 0.6.0's layer semantics (fla/layers/mamba2.py ``torch_forward``, fla/models/mamba2), reading
fla's parameter names, one token at a time:

    z, xBC, dt = split(in_proj(u)),     xBC = silu(causal depthwise conv(xBC) + conv bias)
    x, B, C = split(xBC),  dt = clamp(softplus(dt + dt_bias), dt_limit),  A = -exp(A_log)
    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T   (per head: [head_dim, state_size], fla's state layout)
    y_t = h_t C_t + D x_t,   out = out_proj(rmsnorm_group(y * silu(z)) * norm.weight)

with head ``h`` reading B/C group ``h // (heads / n_groups)`` (mamba_ssm's kernels and fla's decode path) and
the norm over each group's ``heads * head_dim / n_groups`` channels. The model: embeddings, pre-norm residual
blocks of the mixer alone, a final RMSNorm, the LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return out if weight is None else out * weight


def mamba2_layer(
    t: dict[str, torch.Tensor], prefix: str, u: torch.Tensor, config: dict,
    conv_state: torch.Tensor | None = None, ssm_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fla's Mamba2 mixer on ``u`` [B, L, d] in float64 from the tensors ``t`` under ``prefix``; ``conv_state``
    [B, conv_dim, conv_kernel - 1] (the inputs before ``u``) and ``ssm_state`` [B, H, P, N] start it (None:
    zeros). Returns the output and both states after ``u``."""
    u = u.double()
    batch, length, width = u.shape
    heads, head_dim, state = config["num_heads"], config["head_dim"], config["state_size"]
    groups, taps = config.get("n_groups", 1), config.get("conv_kernel", 4)
    inner = heads * head_dim
    conv_dim = inner + 2 * groups * state

    def tensor(name):
        return t[prefix + name].double()

    projected = u @ tensor("in_proj.weight").T
    if prefix + "in_proj.bias" in t:
        projected = projected + tensor("in_proj.bias")
    z, xbc, dt = projected.split((inner, conv_dim, heads), dim=-1)
    if conv_state is None:
        conv_state = u.new_zeros(batch, conv_dim, taps - 1)
    padded = torch.cat((conv_state.double(), xbc.transpose(1, 2)), dim=2)  # [B, conv_dim, taps - 1 + L]
    weight = tensor("conv1d.weight")[:, 0]  # [conv_dim, taps]
    mixed = torch.stack([(padded[:, :, i : i + taps] * weight).sum(-1) for i in range(length)], dim=1)
    if prefix + "conv1d.bias" in t:
        mixed = mixed + tensor("conv1d.bias")
    xbc = F.silu(mixed)
    x, B, C = xbc.split((inner, groups * state, groups * state), dim=-1)
    x = x.view(batch, length, heads, head_dim)
    B, C = B.view(batch, length, groups, state), C.view(batch, length, groups, state)
    low, high = config.get("dt_limit", (0.0, float("inf")))
    dt = F.softplus(dt + tensor("dt_bias")).clamp(low, high)
    A = -torch.exp(tensor("A_log"))
    D = tensor("D")
    h = u.new_zeros(batch, heads, head_dim, state) if ssm_state is None else ssm_state.double()
    outputs = []
    for step in range(length):
        heads_after, y = [], []
        for head in range(heads):
            group = head // (heads // groups)
            decay = torch.exp(dt[:, step, head] * A[head])[:, None, None]
            write = dt[:, step, head][:, None, None] * x[:, step, head, :, None] * B[:, step, group, None, :]
            heads_after.append(decay * h[:, head] + write)
            y.append(torch.einsum("bpn,bn->bp", heads_after[-1], C[:, step, group]) + D[head] * x[:, step, head])
        h = torch.stack(heads_after, dim=1)
        outputs.append(torch.stack(y, dim=1))
    y = torch.stack(outputs, dim=1).reshape(batch, length, inner)
    gated = (y * F.silu(z)).view(batch, length, groups, inner // groups)
    normed = _rms(gated, None, config.get("norm_eps", 1e-5)).view(batch, length, inner) * tensor("norm.weight")
    out = normed @ tensor("out_proj.weight").T
    if prefix + "out_proj.bias" in t:
        out = out + tensor("out_proj.bias")
    return out, padded[:, :, padded.shape[2] - (taps - 1) :], h


def mamba2_logits(t: dict[str, torch.Tensor], config: dict, tokens: torch.Tensor) -> torch.Tensor:
    """fla's ``Mamba2ForCausalLM`` logits [B, L, V] in float64 (no MLP: each block is the mixer alone)."""
    eps = config.get("norm_eps", 1e-5)
    hidden = t["backbone.embeddings.weight"].double()[tokens]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"backbone.layers.{layer}."
        normed = _rms(hidden, t[prefix + "norm.weight"].double(), eps)
        hidden = hidden + mamba2_layer(t, prefix + "mixer.", normed, config)[0]
    hidden = _rms(hidden, t["backbone.norm_f.weight"].double(), eps)
    head = t["backbone.embeddings.weight"] if config.get("tie_word_embeddings") else t["lm_head.weight"]
    return hidden @ head.double().T
