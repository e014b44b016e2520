"""Measurements behind a hardware profile: the runtime's own layers timed on a device (``schedlang profile``).

Contract. :func:`measure_part` builds one part of a model exactly as a generated script does
(:func:`schedlang.runtime.model.build_stage_model`: a token mixer alone, an MLP alone, the embedding, or the
final norm with the LM head and the loss) and times, for one sequence of ``tokens`` rows (after ``prefix`` keys
for an attention layer), its forward, its backward without weight gradients (parameters frozen) and its whole
backward, whose difference is the weight gradients' time (``W``), after one warm-up run: on CUDA the kernels'
summed durations (:func:`kernel_seconds`: device time without launch gaps or host time), on the CPU the median
wall time. The host time of the forward and of the whole backward (the time to return, without waiting for the
device) is kept for the eager launch overhead. :func:`measure_memory_bandwidth`,
:func:`measure_offload_bandwidth` and :func:`measure_links` measure the rest; ``measure_links`` starts one
process per device and times ``torch.distributed`` point-to-point, all-gather and reduce-scatter at two sizes,
fitting latency and bandwidth to them.

Nothing here knows the profile format (schedlang.lowering.hardware_profile): the command turns these records
into one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing

from schedlang.runtime.kv_buffers import AttentionChunk, ChunkPosition, LayerKV, SequenceKV
from schedlang.runtime.model import build_stage_model
from schedlang.vocabulary import LayerKind, ModelConfig

PART_NAMES = ("gla", "simple_gla", "gdn", "attn", "mlp", "embedding", "head")


@dataclass(frozen=True)
class PartTiming:
    part: str
    tokens: int
    prefix: int
    forward_s: float
    backward_s: float  # without the weight gradients
    weight_s: float
    host_forward_s: float
    host_backward_s: float  # the whole backward's, weight gradients included
    # the same two with the saved tensors offloaded (0: not measured); see offloaded_host_seconds
    host_offload_forward_s: float = 0.0
    host_offload_backward_s: float = 0.0
    # the same two with the part run as recompute reruns it (0: not measured); see recomputed_host_seconds
    host_recompute_forward_s: float = 0.0
    host_recompute_backward_s: float = 0.0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_seconds(function: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Device time of ``function``: on CUDA the sum of its kernels' durations (torch.profiler, as
    benchmarks/common.py reads a step), per run, so an eager run's launch gaps and host time stay out (the
    profile's overhead figures carry them); on the CPU the median wall time."""
    if device.type != "cuda":
        return median_seconds(function, device, repeats)
    function()  # warm-up: compiles kernels, allocates
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for _ in range(repeats):
            function()
        synchronize(device)
    total = sum(
        event.device_time_total for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA
    )
    return total / 1e6 / repeats


def median_seconds(function: Callable[[], None], device: torch.device, repeats: int) -> float:
    function()  # warm-up: compiles kernels, allocates
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def part_config(config: ModelConfig, part: str) -> tuple[ModelConfig, tuple[int, ...], bool, bool]:
    """A model config holding ``part`` alone, with the layer indices and the first/last flags that build it."""
    if part == "embedding":
        return config, (), True, False
    if part == "head":
        return config, (), False, True
    if part == "mlp":
        ratio = config.mlp_ratio if config.mlp_ratio > 0 else 4.0
        return dataclasses.replace(config, layers=(LayerKind.MLP,), mlp_ratio=ratio), (0,), False, False
    kind = LayerKind(part)
    # a mixer without its MLP: the MLP is a layer of its own ([Note: separate MLP layers])
    layers = (kind, LayerKind.MLP) if config.mlp_ratio > 0 else (kind,)
    return dataclasses.replace(config, layers=layers), (0,), False, False


def measure_part(
    config: ModelConfig, part: str, tokens: int, device: torch.device, dtype: torch.dtype, prefix: int = 0,
    repeats: int = 3, seed: int = 0, offload_host: bool = False, recompute_host: bool = False,
) -> PartTiming:
    """Time ``part`` of ``config`` over one sequence of ``tokens`` rows; see the module docstring. With
    ``offload_host``, also the host times with the part's saved tensors offloaded (:func:`offloaded_host_seconds`);
    with ``recompute_host``, those of a block's part run under ``recompute`` (:func:`recomputed_host_seconds`)."""
    part_model_config, indices, is_first, is_last = part_config(config, part)
    model = build_stage_model(part_model_config, indices, is_first, is_last, seed, device, dtype)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    token_ids = torch.randint(0, config.vocab, (1, tokens), generator=generator).to(device)
    hidden = (torch.randn(1, tokens, config.d_model, generator=generator) * 0.5).to(device=device, dtype=dtype)
    position = None
    if part == "attn":
        kv = SequenceKV(prefix + tokens)
        geometry = part_model_config.attention_geometry
        shape = (1, geometry.kv_heads, prefix + tokens, geometry.head_dim)
        kv.open[(0, 0)] = LayerKV(torch.zeros(shape, device=device, dtype=dtype),
                                  torch.zeros(shape, device=device, dtype=dtype))
        position = ChunkPosition(kv, 0, prefix, prefix + tokens)

    def forward(inputs: torch.Tensor) -> torch.Tensor:
        if is_last:
            return model.loss(inputs, token_ids)
        states = [AttentionChunk(position, 0) if part == "attn" else None]
        output, _ = model(inputs, states[: len(indices)] if indices else [], position)
        return output

    def make_inputs() -> torch.Tensor:
        return token_ids if is_first else hidden.detach().requires_grad_(True)

    def run_forward() -> None:
        forward(make_inputs())  # with grad, as a training step runs it (saving for the backward); then freed

    def run_forward_backward() -> None:
        run_backward(forward(make_inputs()))
        for parameter in model.parameters():
            parameter.grad = None

    forward_s = kernel_seconds(run_forward, device, repeats)
    whole_s = kernel_seconds(run_forward_backward, device, repeats) - forward_s
    host = host_seconds(model, forward, make_inputs, device, repeats)
    # the sequence-wide K/V buffers stay on the device under offload, as the executor keeps them
    buffers = [tensor for layer in position.kv.open.values() for tensor in (layer.keys, layer.values)] if position else []
    offloaded = (offloaded_host_seconds(model, forward, make_inputs, device, repeats, buffers) if offload_host
                 else (0.0, 0.0))
    recomputed = (recomputed_host_seconds(model, forward, make_inputs, device, repeats)
                  if recompute_host and part not in ("embedding", "head") else (0.0, 0.0))
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    # the embedding's input is token ids: its whole backward is its weight gradient
    input_only_s = 0.0 if is_first else kernel_seconds(run_forward_backward, device, repeats) - forward_s
    weight_s = max(whole_s - input_only_s, 0.0)
    return PartTiming(
        part, tokens, prefix, forward_s, max(whole_s - weight_s, 0.0), weight_s, *host, *offloaded, *recomputed,
    )


def host_seconds(
    model: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], make_inputs: Callable[[], torch.Tensor],
    device: torch.device, repeats: int,
    saving: Callable[[int], contextlib.AbstractContextManager] = lambda round_: contextlib.nullcontext(),
    backward: Callable[[int, torch.Tensor], None] = lambda round_, output: run_backward(output),
) -> tuple[float, float]:
    """Median host seconds of the part's forward (under ``saving(round)``) and of its whole backward after it
    (``backward(round, output)``), each from a synchronized device, after one warm-up round."""
    forward_host, backward_host = [], []
    for round_ in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        with saving(round_):
            output = forward(make_inputs())
        forward_host.append(time.perf_counter() - start)
        synchronize(device)
        start = time.perf_counter()
        backward(round_, output)
        backward_host.append(time.perf_counter() - start)
        synchronize(device)
        for parameter in model.parameters():
            parameter.grad = None
    return statistics.median(forward_host[1:]), statistics.median(backward_host[1:])


def run_backward(output: torch.Tensor) -> None:
    """Backward from ``output`` with unit upstream gradients (none for a scalar loss)."""
    output.backward(torch.ones_like(output) if output.dim() else None)


def recomputed_host_seconds(
    model: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], make_inputs: Callable[[], torch.Tensor],
    device: torch.device, repeats: int,
) -> tuple[float, float]:
    """:func:`host_seconds` with each block's part run as ``pipeline.recompute`` runs it (``mixer`` for a token
    mixer, ``mlp`` for an MLP: the runtime's checkpoint keeps the part's inputs, and the backward reruns it),
    the blocks' modes restored afterwards."""
    from schedlang.runtime.model import Block
    from schedlang.vocabulary import Recompute

    blocks = [module for module in model.modules() if isinstance(module, Block)]
    modes = [block.recompute for block in blocks]
    for block in blocks:
        block.recompute = Recompute.MIXER if block.mixer is not None else Recompute.MLP
    try:
        return host_seconds(model, forward, make_inputs, device, repeats)
    finally:
        for block, mode in zip(blocks, modes):
            block.recompute = mode


def offloaded_host_seconds(
    model: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], make_inputs: Callable[[], torch.Tensor],
    device: torch.device, repeats: int, resident: Sequence[torch.Tensor] = (),
) -> tuple[float, float]:
    """Median host seconds of the part's forward with what it saves offloaded as ``pipeline.offload`` does
    (:class:`~schedlang.runtime.offload.ActivationOffload`: a pack hook and a copy to pinned memory per saved
    tensor, parameters and the ``resident`` tensors left on the device), and of the prefetch, backward and release after it; after one
    warm-up round, which pins the slabs the later rounds reuse."""
    from schedlang.runtime.offload import ActivationOffload, storage_key

    kept = {storage_key(tensor) for tensor in (*model.parameters(), *resident)}
    offload = ActivationOffload(device, lambda tensor: storage_key(tensor) in kept)

    def backward(key: int, output: torch.Tensor) -> None:
        offload.prefetch(key)
        run_backward(output)
        offload.release(key)

    return host_seconds(model, forward, make_inputs, device, repeats, saving=offload.saving, backward=backward)


def measure_memory_bandwidth(device: torch.device, n_bytes: int) -> float:
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    source = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device, 5)
    return 2 * n_bytes / seconds


def measure_offload_bandwidth(device: torch.device, n_bytes: int) -> float:
    """Bytes per second of a copy from the device into pinned host memory (CUDA only)."""
    source = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty(source.shape, dtype=torch.float32, pin_memory=True)
    seconds = median_seconds(lambda: target.copy_(source, non_blocking=True), device, 5)
    return n_bytes / seconds


@dataclass(frozen=True)
class LinkFit:
    latency_s: float
    bandwidth_bytes_per_s: float


def fit_latency_bandwidth(small: tuple[float, float], large: tuple[float, float]) -> LinkFit:
    """The line through (bytes, seconds) at two sizes: latency at zero bytes, bandwidth its inverse slope."""
    (small_bytes, small_s), (large_bytes, large_s) = small, large
    slope = max((large_s - small_s) / (large_bytes - small_bytes), 1e-15)
    return LinkFit(max(small_s - slope * small_bytes, 0.0), 1.0 / slope)


LINK_SIZES = (1 << 16, 1 << 26)


def _link_worker(rank: int, world_size: int, backend: str, device_type: str, store_path: str, out_path: str) -> None:
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    results = {}
    try:
        for size in LINK_SIZES:
            elements = size // 4
            send = torch.ones(elements, device=device)
            receive = torch.empty_like(send)

            def point_to_point() -> None:
                if rank == 0:
                    dist.send(send, 1)
                elif rank == 1:
                    dist.recv(receive, 0)
                dist.barrier()

            gathered = torch.empty(elements * world_size, device=device)
            scattered = torch.empty(elements, device=device)
            whole = torch.ones(elements * world_size, device=device)
            collectives = {
                "p2p": point_to_point,
                "all_gather": lambda: dist.all_gather_into_tensor(gathered, send),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(scattered, whole),
            }
            for name, function in collectives.items():
                dist.barrier()
                results[name, size] = median_seconds(function, device, 5)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        torch.save(results, out_path)


def measure_links(world_size: int, backend: str, device_type: str) -> dict[str, LinkFit]:
    """Latency and bandwidth of ``p2p``, ``all_gather`` and ``reduce_scatter`` among ``world_size`` local
    processes (one per device): collectives are fitted per rank's contribution, as the cost model charges
    ``P - 1`` contributions through the collective's bandwidth."""
    with tempfile.TemporaryDirectory() as directory:
        store, out = os.path.join(directory, "store"), os.path.join(directory, "links.pt")
        multiprocessing.spawn(_link_worker, args=(world_size, backend, device_type, store, out), nprocs=world_size)
        results = torch.load(out)
    fits = {}
    for name in ("p2p", "all_gather", "reduce_scatter"):
        contributions = 1 if name == "p2p" else world_size - 1
        small, large = ((size * contributions, results[name, size]) for size in LINK_SIZES)
        fits[name] = fit_latency_bandwidth(small, large)
    return fits
