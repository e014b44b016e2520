"""An independent float64 re-statement of fla's ``Mamba3`` layer (SISO, fla 0.6.0's ``fla/layers/mamba3.py``)
around the recurrence of mamba_ssm's ``mamba3_siso_step_ref`` (the reference its Triton kernels are held to),
token by token, in mamba_ssm's layouts: the SSM state ``[B, H, P, N]``, the angle state ``[B, H, A]``, the
last rotated key ``[B, H, N]`` and input ``[B, H, P]``.

fla's layer only calls mamba_ssm's CUDA kernels, so this is the CPU stand-in the tests hold the mixer to.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _rms(values, weight, eps):
    return values * torch.rsqrt(values.square().mean(-1, keepdim=True) + eps) * weight


def _turn(tensor, cos, sin):
    """mamba_ssm's pairwise rotary: pairs (2i, 2i + 1), angles past the given ones padded with cos 1, sin 0."""
    pairs = tensor.view(*tensor.shape[:-1], -1, 2)
    first, second = pairs[..., 0], pairs[..., 1]
    pad = first.shape[-1] - cos.shape[-1]
    cos, sin = F.pad(cos, (0, pad), value=1.0), F.pad(sin, (0, pad), value=0.0)
    return torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1).view_as(tensor)


def mamba3_layer(tensors: dict, hidden: torch.Tensor, config: dict, state=None):
    """fla's ``Mamba3.forward`` on ``hidden`` ``[B, L, d_model]`` with ``tensors`` (fla's parameter names) and
    ``config`` (``num_heads``, ``head_dim``, ``state_size``, ``n_groups``, ``rope_fraction``, ``A_floor``,
    ``is_outproj_norm``, ``norm_eps``); ``state`` ``(angle, ssm, key, value)`` or None. Returns the output and
    the final ``(angle, ssm, key, value)``."""
    heads, head_dim, size, groups = config["num_heads"], config["head_dim"], config["state_size"], config["n_groups"]
    eps = config["norm_eps"]
    turned = int(size * config["rope_fraction"])
    angle_count = (turned - turned % 2) // 2
    width = heads * head_dim
    batch, length, _ = hidden.shape
    projected = F.linear(hidden, tensors["in_proj.weight"], tensors.get("in_proj.bias"))
    z, x, B, C, dd_dt, dd_A, trap, angles = projected.split(
        [width, width, groups * size, groups * size, heads, heads, heads, angle_count], dim=-1
    )
    z = z.reshape(batch, length, heads, head_dim)
    x = x.reshape(batch, length, heads, head_dim)
    B = _rms(B.reshape(batch, length, groups, size), tensors["B_norm.weight"], eps)
    C = _rms(C.reshape(batch, length, groups, size), tensors["C_norm.weight"], eps)
    B = B.repeat_interleave(heads // groups, dim=2) + tensors["B_bias"][:, 0]
    C = C.repeat_interleave(heads // groups, dim=2) + tensors["C_bias"][:, 0]
    A = (-F.softplus(dd_A)).clamp(max=-config["A_floor"])
    dt = F.softplus(dd_dt + tensors["dt_bias"])
    adt = A * dt
    trap = torch.sigmoid(trap)
    angles = torch.tanh(angles) * math.pi
    if state is None:
        angle = hidden.new_zeros(batch, heads, angle_count)
        ssm = hidden.new_zeros(batch, heads, head_dim, size)
        key = hidden.new_zeros(batch, heads, size)
        value = hidden.new_zeros(batch, heads, head_dim)
    else:
        angle, ssm, key, value = state
    outputs = []
    for t in range(length):
        angle = angle + angles[:, t, None, :] * dt[:, t, :, None]
        angle = angle - 2 * math.pi * torch.floor(angle / (2 * math.pi))
        q, k = _turn(C[:, t], angle.cos(), angle.sin()), _turn(B[:, t], angle.cos(), angle.sin())
        alpha = torch.exp(adt[:, t])
        beta = (1 - trap[:, t]) * dt[:, t] * alpha
        gamma = trap[:, t] * dt[:, t]
        ssm = alpha[..., None, None] * ssm
        ssm = ssm + beta[..., None, None] * (value[..., :, None] * key[..., None, :])
        ssm = ssm + gamma[..., None, None] * (x[:, t, :, :, None] * k[..., None, :])
        y = torch.einsum("bhpn,bhn->bhp", ssm, q) + tensors["D"][None, :, None] * x[:, t]
        outputs.append(y)
        key, value = k, x[:, t]
    y = torch.stack(outputs, dim=1).reshape(batch, length, width)
    gate = z.reshape(batch, length, width)
    if config["is_outproj_norm"]:
        grouped = y.view(batch, length, heads, head_dim)
        y = (grouped * torch.rsqrt(grouped.square().mean(-1, keepdim=True) + eps)).reshape(y.shape)
        y = y * tensors["norm.weight"] * F.silu(gate)
    else:
        y = y * F.silu(gate)
    output = F.linear(y, tensors["out_proj.weight"], tensors.get("out_proj.bias"))
    return output, (angle, ssm, key, value)


def mamba3_logits(t: dict[str, torch.Tensor], config: dict, tokens: torch.Tensor) -> torch.Tensor:
    """fla's ``Mamba3ForCausalLM`` logits [B, L, V] in float64 (no MLP: each block is the mixer alone), from its
    tensors ``t`` (fla's names) and ``config.json`` values."""
    eps = config.get("norm_eps", 1e-5)
    heads = round(config["expand"] * config["hidden_size"]) // config["head_dim"]
    layer_config = {
        "num_heads": heads, "head_dim": config["head_dim"], "state_size": config["state_size"],
        "n_groups": config.get("n_groups", 1), "rope_fraction": config.get("rope_fraction", 0.5),
        "A_floor": config.get("A_floor", 1e-4), "is_outproj_norm": config.get("is_outproj_norm", False),
        "norm_eps": eps,
    }
    hidden = t["backbone.embeddings.weight"].double()[tokens]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"backbone.layers.{layer}."
        mixer = {name.removeprefix(prefix + "mixer."): tensor.double() for name, tensor in t.items()
                 if name.startswith(prefix + "mixer.")}
        normed = _rms(hidden, t[prefix + "norm.weight"].double(), eps)
        hidden = hidden + mamba3_layer(mixer, normed, layer_config)[0]
    hidden = _rms(hidden, t["backbone.norm_f.weight"].double(), eps)
    head = t["backbone.embeddings.weight"] if config.get("tie_word_embeddings") else t["lm_head.weight"]
    return hidden @ head.double().T
