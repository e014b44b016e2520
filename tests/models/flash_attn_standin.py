"""A stand-in ``flash_attn`` module for the tests, so that flash-linear-attention's ``Attention`` layer can be
built where the ``flash_attn`` package is not installed (fla's layer raises ImportError at construction
without it).

This is a reference, not fla's kernel: ``flash_attn_func`` is torch's ``scaled_dot_product_attention`` over
flash-attn's ``[B, L, H, D]`` layout, each key/value head repeated for its query heads, causal with the query
and key positions aligned (equal lengths, as a forward over a whole sequence has). ``flash_attn_varlen_func``
(packed sequences) is not provided and raises NotImplementedError. :func:`install` puts the module in
``sys.modules`` before fla is imported, and only when no real ``flash_attn`` is importable.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import torch
import torch.nn.functional as F

MODULE_NAME = "flash_attn"


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **unused):
    """Attention of ``q`` ``[B, L, H, D]`` over ``k``, ``v`` ``[B, L, H_kv, D]`` (``H_kv`` dividing ``H``)."""
    if dropout_p or tuple(window_size) != (-1, -1) or q.shape[1] != k.shape[1]:
        raise NotImplementedError("the stand-in flash_attn_func has no dropout, window or unequal lengths")
    groups = q.shape[2] // k.shape[2]
    k, v = (tensor.repeat_interleave(groups, dim=2) for tensor in (k, v))
    output = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale
    )
    return output.transpose(1, 2)


def flash_attn_varlen_func(*args, **kwargs) -> torch.Tensor:
    raise NotImplementedError("the stand-in flash_attn has no varlen attention")


def install() -> None:
    """Register the stand-in as ``flash_attn`` unless a real one is importable or already imported."""
    if MODULE_NAME in sys.modules or importlib.util.find_spec(MODULE_NAME) is not None:
        return
    if any(name == "fla" or name.startswith("fla.") for name in sys.modules):
        raise RuntimeError("install the flash_attn stand-in before fla is imported")
    module = types.ModuleType(MODULE_NAME, __doc__)
    module.__spec__ = importlib.machinery.ModuleSpec(MODULE_NAME, None)
    module.flash_attn_func = flash_attn_func
    module.flash_attn_varlen_func = flash_attn_varlen_func
    sys.modules[MODULE_NAME] = module
