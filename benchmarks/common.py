"""Helpers the benchmark scripts share: waiting for a device, its memory figures, byte counts in words.

Every function takes the ``torch.device`` a measurement runs on and is a no-op (or 0) off CUDA, so a script's
whole path runs on the CPU too; only the numbers need a GPU.
"""

from __future__ import annotations

import gc

import torch
from torch import nn


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_now(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def peak_reserved(device: torch.device) -> int:
    """What the caching allocator held at most. Unlike the allocated peak it sees CUDA-graph pools whole: the
    intermediate tensors of a captured graph are freed in the allocator's books at the end of capture, yet
    every replay writes their blocks, which stay reserved in the graph's private pool."""
    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0


def reserved_now(device: torch.device) -> int:
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def release(device: torch.device) -> None:
    """Drop unreachable tensors and hand the allocator's free blocks back, so the next figure starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def model_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the weights, their gradients and the optimizer's state: what a step keeps whatever the schedule."""
    tensors = [parameter for parameter in module.parameters()]
    tensors += [parameter.grad for parameter in module.parameters() if parameter.grad is not None]
    tensors += [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f}"
