"""Time the three sequence-parallel state-passing methods: All-Scan, LASP ring, LASP-2 all-gather.

Two measurements per method, each forward + backward, each the median over
iterations of the slowest rank's time:

* ``scan``: the cross-rank state scan alone (``StateScanFunction``) on a state of
  ``[B, H, K, V]`` float32, with a final state, as in a chained span;
* ``layer``: the whole ``sequence_parallel_chunk_gla`` on a span of ``--length``
  tokens split evenly, next to the single-device ``chunk_gla`` on the same span
  (run on rank 0 of the same job, so the peer shares the machine and the run).

CPU (gloo, one process per rank; ranks share the cores, so this is a functional
comparison, not a speed claim)::

    python benchmarks/sequence_parallel.py --ranks 2 4

GPU (NCCL, one GPU per rank, Triton kernels)::

    python benchmarks/sequence_parallel.py --device cuda --ranks 2 4 8 --length 65536
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from schedlang.kernels import chunk_gla
from schedlang.runtime.sequence_parallel import (
    ScanConfig,
    SequenceParallelMethod,
    StateScanFunction,
    sequence_parallel_chunk_gla,
)

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import synchronize  # noqa: E402

METHOD_VARIANTS = [
    (SequenceParallelMethod.RING, 1),
    (SequenceParallelMethod.ALLSCAN, 1),
    (SequenceParallelMethod.ALLSCAN, 4),
    (SequenceParallelMethod.ALLSCAN, 16),
    (SequenceParallelMethod.ALLGATHER, 1),
]


def _time_interleaved(steps: dict, device: torch.device, warmup: int, iterations: int) -> dict:
    """Median over iterations of the slowest rank's milliseconds, for each named step.

    The steps take turns within every iteration, so load that drifts during the
    run (a shared machine) falls on all of them alike.
    """
    for _ in range(warmup):
        for step in steps.values():
            step()
    samples = {name: [] for name in steps}
    for _ in range(iterations):
        for name, step in steps.items():
            dist.barrier()
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            elapsed = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            samples[name].append(elapsed.item())
    return {name: statistics.median(values) for name, values in samples.items()}


def _scan_step(state_shape, method, blocks, device):
    batch, heads, key_dim, value_dim = state_shape
    local_state = torch.randn(state_shape, device=device, requires_grad=True)
    gamma = torch.rand(batch, heads, key_dim, device=device).requires_grad_(True)
    initial_state = torch.randn(state_shape, device=device, requires_grad=True)
    config = ScanConfig(group=None, method=method, scan_blocks=blocks, output_final_state=True)
    grad_state_in = torch.randn(state_shape, device=device)

    def step():
        state_in, final_state = StateScanFunction.apply(local_state, gamma, initial_state, config)
        torch.autograd.backward([state_in, final_state], [grad_state_in, torch.zeros_like(final_state)])

    return step


def _layer_inputs(length, heads, head_dim, device, generator_seed):
    generator = torch.Generator().manual_seed(generator_seed)
    shape = (1, length, heads, head_dim)
    q = torch.randn(shape, generator=generator)
    k = torch.randn(shape, generator=generator)
    v = torch.randn(shape, generator=generator)
    g = torch.nn.functional.logsigmoid(torch.randn(shape, generator=generator) + 3.0)
    grad_output = torch.randn(shape, generator=generator)
    return [tensor.to(device) for tensor in (q, k, v, g, grad_output)]


def _layer_step(full_inputs, rank, world_size, method, blocks, backend):
    length = full_inputs[0].shape[1]
    share = length // world_size
    local = [tensor[:, rank * share : (rank + 1) * share].clone() for tensor in full_inputs]
    q, k, v, g = (tensor.requires_grad_(True) for tensor in local[:4])
    grad_output = local[4]

    def step():
        o, _ = sequence_parallel_chunk_gla(
            q, k, v, g, group=None, method=method, scan_blocks=blocks, backend=backend
        )
        o.backward(grad_output)

    return step


def _single_device_step(full_inputs, backend):
    q, k, v, g = (tensor.clone().requires_grad_(True) for tensor in full_inputs[:4])
    grad_output = full_inputs[4]

    def step():
        o, _ = chunk_gla(q, k, v, g, backend=backend)
        o.backward(grad_output)

    return step


def _worker(rank, world_size, init_file, arguments, result_file):
    device = torch.device(arguments.device, rank) if arguments.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
    )
    backend = "triton" if device.type == "cuda" else "torch"
    rows = []
    for state_shape in arguments.state_shapes:
        steps = {
            (method, blocks): _scan_step(state_shape, method, blocks, device)
            for method, blocks in METHOD_VARIANTS
            if blocks <= state_shape[2]
        }
        timings = _time_interleaved(steps, device, arguments.warmup, arguments.iterations)
        for (method, blocks), milliseconds in timings.items():
            rows.append(dict(kind="scan", ranks=world_size, shape=list(state_shape), method=method.value, blocks=blocks, ms=milliseconds))

    full_inputs = _layer_inputs(arguments.length, arguments.heads, arguments.head_dim, device, 0)
    layer_shape = [1, arguments.length, arguments.heads, arguments.head_dim]
    steps = {
        (method.value, blocks): _layer_step(full_inputs, rank, world_size, method, blocks, backend)
        for method, blocks in METHOD_VARIANTS
    }
    # The single-device peer: rank 0 runs the whole span while the others wait at the barrier.
    steps[("single-device", 0)] = _single_device_step(full_inputs, backend) if rank == 0 else (lambda: None)
    timings = _time_interleaved(steps, device, arguments.warmup, arguments.iterations)
    for (method, blocks), milliseconds in timings.items():
        ranks = 1 if method == "single-device" else world_size
        rows.append(dict(kind="layer", ranks=ranks, shape=layer_shape, method=method, blocks=blocks, ms=milliseconds))

    if rank == 0:
        with open(result_file, "w") as handle:
            json.dump(rows, handle)
    dist.destroy_process_group()


def _print_table(rows):
    print("| what | ranks | shape | method | blocks | ms (fwd+bwd, median of slowest rank) | vs ring |")
    print("|---|---|---|---|---|---|---|")
    ring_time = {
        (row["kind"], row["ranks"], tuple(row["shape"])): row["ms"] for row in rows if row["method"] == "ring"
    }
    for row in rows:
        peer = ring_time.get((row["kind"], row["ranks"], tuple(row["shape"])))
        ratio = f"{row['ms'] / peer:.2f}x" if peer else "-"
        shape = "x".join(str(size) for size in row["shape"])
        print(f"| {row['kind']} | {row['ranks']} | {shape} | {row['method']} | {row['blocks'] or '-'} | {row['ms']:.3f} | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--length", type=int, default=2048, help="tokens of the span in the layer measurement")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    arguments = parser.parse_args()
    arguments.state_shapes = [(1, 4, 64, 64), (1, 16, 128, 128)]
    for world_size in arguments.ranks:
        if arguments.length % world_size:
            parser.error(f"--length {arguments.length} is not divisible by {world_size} ranks")
    rows = []
    for world_size in arguments.ranks:
        with tempfile.TemporaryDirectory() as directory:
            result_file = os.path.join(directory, "rows.json")
            mp.spawn(
                _worker,
                args=(world_size, os.path.join(directory, "store"), arguments, result_file),
                nprocs=world_size,
                join=True,
            )
            with open(result_file) as handle:
                rows.extend(json.load(handle))
    _print_table(rows)


if __name__ == "__main__":
    main()
