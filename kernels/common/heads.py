"""Grouped heads: one head of queries and keys (or of keys and values) shared by consecutive heads.

[Note: grouped head order]
Head ``j`` of a ``[B, L, G, D]`` tensor serves the ``heads / G`` consecutive heads ``j heads / G ..`` of a
``heads``-head operator (einops' ``h d -> (h g) d``): the order of grouped-query attention and of
flash-linear-attention's grouped value heads (``num_v_heads``, whose kernels read q/k head ``i_hv // (HV / H)``).
"""

from __future__ import annotations

import torch


def repeat_each_head(per_head: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, L, G, D]`` as ``[B, L, heads, D]``: head ``j`` repeated for the ``heads / G`` consecutive heads it
    serves ([Note: grouped head order])."""
    groups = heads // per_head.shape[2]
    return per_head if groups == 1 else per_head.repeat_interleave(groups, dim=2)


def sum_each_head_group(per_served_head: torch.Tensor, groups: int) -> torch.Tensor:
    """The adjoint of :func:`repeat_each_head`: ``[B, L, heads, D]`` summed over each run of ``groups``
    consecutive heads to ``[B, L, heads / groups, D]``."""
    if groups == 1:
        return per_served_head
    batch, length, heads, dim = per_served_head.shape
    return per_served_head.view(batch, length, heads // groups, groups, dim).sum(dim=3)
