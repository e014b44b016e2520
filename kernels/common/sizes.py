"""Host-side sizes and launch options for the Triton launches, as plain Python (triton.cdiv and
triton.next_power_of_2 are constexpr functions whose call costs several microseconds of host time each in
Triton 3.6)."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def cdiv(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def next_power_of_2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def block_size(dim: int, largest: int) -> int:
    """A power-of-two tile edge covering ``dim``, at least 16 (the smallest matrix-product tile), at most ``largest``."""
    return max(16, min(largest, next_power_of_2(dim)))


def states_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the Triton kernels store chunk states and updates in: 16-bit inputs keep 16 bits (the scans and every
    product accumulate in float32), float32 and float64 inputs get float32."""
    return torch.float32 if dtype in (torch.float32, torch.float64) else dtype


def launch_options(entry: dict) -> dict:
    """The num_warps / num_stages of a launch-table entry, as Triton launch keyword arguments."""
    return {name: entry[name] for name in ("num_warps", "num_stages")}


def products_precision(table: Mapping[str, Mapping], dtype: torch.dtype) -> str:
    """The ``input_precision`` of a kernel module's matrix products for inputs of ``dtype``: its launch table's
    ``products`` entry, ``float32`` for float32 inputs and ``reduced`` otherwise (16-bit operands ignore it).
    "tf32" rounds each float32 operand to a 10-bit mantissa; "tf32x3" (three tf32 products) and "ieee" keep
    float32's error where rounding compounds or cancels."""
    return table["products"]["float32" if dtype == torch.float32 else "reduced"]
