"""Helpers the benchmark scripts share: waiting for a device, its memory figures, the kernel time of a profiled
step, byte counts in words, the search for the longest sequence that fits.

Every function takes the ``torch.device`` a measurement runs on and is a no-op (or 0) off CUDA, so a script's
whole path runs on the CPU too; only the numbers need a GPU.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from pathlib import Path

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


def single_rank_environment(port: int) -> None:
    """The variables torch.distributed's env:// rendezvous reads, for a process group of one rank on this host
    (a benchmark run as a plain script, without torchrun); variables already set win."""
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)), ("RANK", "0"), ("WORLD_SIZE", "1"),
                        ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)


def launch_single_stage(configs):
    """A Trainer of ``configs`` (a compiled schedule's MODEL, PIPELINE, TRAIN) on one CUDA rank, the allocator
    released and its peaks reset first, so that the peaks read afterwards are this trainer's."""
    from schedlang.runtime.trainer import launch

    device = torch.device("cuda")
    release(device)
    reset_peak(device)
    return launch(configs.model, configs.pipeline, configs.train, (1, 1, 1), "cuda")


def model_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the weights, their gradients and the optimizer's state: what a step keeps whatever the schedule."""
    tensors = [parameter for parameter in module.parameters()]
    tensors += [parameter.grad for parameter in module.parameters() if parameter.grad is not None]
    tensors += [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f}"


KERNELS_KEPT = 40
"""How many kernel names, by total time, a record keeps (``kernels``: name -> seconds in the profiled step)."""


def kernel_seconds_of_step(
    step, device: torch.device, trace: Path | None = None
) -> tuple[float, float, dict[str, float]]:
    """One more ``step()`` under torch.profiler: seconds of compute kernels, of communication kernels, and per name.

    Against the step time this splits a rank's step into its own GPU work, communication and idle time
    (bubbles, waits, host-bound launch gaps): the figure that says why a schedule is slower than its model.
    The per-name totals (the ``KERNELS_KEPT`` largest) say where one system's GPU work differs from another's;
    ``trace`` (a path) also gets the step as a Chrome trace, which shows when kernels overlap.
    """
    if device.type != "cuda":
        return 0.0, 0.0, {}
    # One step first, not waited for: the profiled step then queues behind it as every step of a timed loop
    # does. Profiled from an idle GPU, the host work at the start of a step (zeroing the gradients, the tokens)
    # would show as a wait that the steady state hides.
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        step()
        synchronize(device)
    if trace is not None:
        profiler.export_chrome_trace(str(trace))
    compute = communication = 0.0
    by_name: dict[str, float] = {}
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            seconds = event.device_time_total / 1e6
            by_name[event.name] = by_name.get(event.name, 0.0) + seconds
            if "nccl" in event.name.lower():
                communication += seconds
            else:
                compute += seconds
    largest = sorted(by_name.items(), key=lambda item: -item[1])[:KERNELS_KEPT]
    return compute, communication, dict(largest)


KERNEL_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl",)),
    ("attention (flash / memory-efficient)", ("flash", "fmha", "attention", "attn")),  # before CUTLASS: fmha_cutlass*
    ("matrix products (cuBLAS / CUTLASS)", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "splitk")),
    ("recurrent operators (Triton)", ("gla_", "gdn_", "chunk_state_scan", "ssd_", "mamba")),
    ("pointwise operators (Triton)", ("swiglu", "log_sigmoid_gate", "short_convolution")),
    ("norms", ("norm", "moments")),
    ("loss and softmax", ("softmax", "cross_entropy", "nll_loss", "logsumexp")),
    ("copies, casts, fills", ("copy", "memcpy", "memset", "fill", "cat", "index", "gather", "scatter", "embedding")),
    ("reductions", ("reduce",)),
    ("elementwise", ("elementwise", "pointwise", "unrolled", "vectorized")),
)
"""(family, name fragments) in the order :func:`kernel_family` tries them: the first family one of whose
fragments a kernel's name contains (lower-cased) is its family; names matching none are "other"."""


def kernel_family(name: str) -> str:
    """The family of a CUDA kernel by its name, for a profile's table of time by family (issue 37)."""
    lowered = name.lower()
    for family, fragments in KERNEL_FAMILIES:
        if any(fragment in lowered for fragment in fragments):
            return family
    return "other"


def time_by_family(by_name: dict[str, float]) -> dict[str, float]:
    """Per-name totals summed by :func:`kernel_family`, largest first."""
    totals: dict[str, float] = {}
    for name, value in by_name.items():
        family = kernel_family(name)
        totals[family] = totals.get(family, 0.0) + value
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def longest_fitting_length(fits_at, start: int, step: int, maximum: int) -> int | None:
    """The longest multiple of ``step`` in ``[start, maximum]`` for which ``fits_at`` holds, assuming that whatever
    fits a length fits every shorter one: ``start`` first (None if it does not fit), then doubling up to
    ``maximum`` until a length fails, then bisection between the last that fit and the first that failed, in
    whole steps. ``start`` and ``maximum`` are multiples of ``step``."""
    if not fits_at(start):
        return None
    good, bad = start, None
    while bad is None and good < maximum:
        candidate = min(2 * good, maximum)
        if fits_at(candidate):
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > step:
        middle = good + (bad - good) // (2 * step) * step
        if fits_at(middle):
            good = middle
        else:
            bad = middle
    return good


def median_ms(step, warmup: int, iterations: int, device: torch.device = torch.device("cuda")) -> float:
    """Median milliseconds of ``step`` over ``iterations`` calls after ``warmup`` untimed ones, each call timed
    alone: with a pair of CUDA events on a GPU, with the host clock on the CPU."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iterations):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            step()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def host_ms(step, warmup: int, iterations: int, device: torch.device = torch.device("cuda")) -> float:
    """Median milliseconds the host spends inside ``step()`` (its Python, dispatch and kernel launches), each call
    started on an idle GPU and not waited for: beside :func:`median_ms` it says whether a step is host-bound
    (host time near the step's) or GPU-bound."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iterations):
        synchronize(device)
        began = time.perf_counter()
        step()
        times.append((time.perf_counter() - began) * 1e3)
    synchronize(device)
    return statistics.median(times)


def capture_graph(step) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
    """``step`` warmed up on a side stream, captured in a CUDA graph and replayed once: (graph, the tensors the
    captured step returned, which every replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    return graph, captured
