"""ZeCO's operator benchmark: one GLA layer split over the ranks of a sequence-parallel group.

Weak scaling, as ZeCO measures it: each of P ranks holds ``--length-per-rank`` tokens, and the peer is one
device running ``chunk_gla`` on that many tokens, in the same job. Every row is forward + backward, the
median over iterations of the slowest rank's time; the steps take turns within each iteration.

* ``layer``: ``sequence_parallel_chunk_gla`` on P ranks x L tokens, per scan method (ring, All-Scan with
  several block counts, all-gather); its ratio to ``one-device``;
* ``one-device``: ``chunk_gla`` on L tokens on rank 0 (the other ranks wait at the barrier);
* ``scan``: the cross-rank scan alone, forward and reverse, on the layer's ``[1, H, K, V]`` float32 state;
* ``rank-work`` (world size 1 only): what one rank computes, without communication: the operator's phases
  finished from a given incoming state and final-state gradient, with the local terms it reads
  ([Note: span phases] in kernels/common/function.py, [Note: local terms on demand] in
  runtime/sequence_parallel.py): ``end``, one per step (either rank of two), ``middle``, both. Its peer is
  ``one-device-phases``, the same operator's phases without autograd on the same tokens: the ratio is the
  compute that sequence parallelism adds.

A world size of 1 runs the sequence-parallel layer on a group of one rank (no communication).

CPU (gloo, ranks share the cores: a functional run, not a speed claim)::

    python benchmarks/sequence_parallel.py --ranks 1 2 --length-per-rank 512

GPU (NCCL, one GPU per rank, Triton kernels, bf16 as models train)::

    python benchmarks/sequence_parallel.py --device cuda --dtype bf16 --ranks 1 2 --length-per-rank 32768
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from schedlang.kernels import chunk_gla
from schedlang.kernels.gla.chunk import implementation_for
from schedlang.runtime.scan_common import DiagonalDecay, ScanDirection
from schedlang.runtime.sequence_parallel import ScanConfig, SequenceParallelMethod, scan_states, sequence_parallel_chunk_gla

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def method_variants(block_counts: list[int], key_dim: int) -> list[tuple[SequenceParallelMethod, int]]:
    """(method, blocks) pairs: ring, All-Scan with each block count that fits K rows, all-gather."""
    allscan = [(SequenceParallelMethod.ALLSCAN, blocks) for blocks in block_counts if 1 <= blocks <= key_dim]
    return [(SequenceParallelMethod.RING, 1), *allscan, (SequenceParallelMethod.ALLGATHER, 1)]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(steps: dict, device: torch.device, warmup: int, iterations: int) -> dict:
    """Median over iterations of the slowest rank's milliseconds, for each named step.

    The steps take turns within every iteration, so load that drifts during the run falls on all of them
    alike. The maximum over ranks is reduced on the steps' device (NCCL has no CPU tensors).
    """
    for _ in range(warmup):
        for step in steps.values():
            step()
    samples = {name: [] for name in steps}
    for _ in range(iterations):
        for name, step in steps.items():
            dist.barrier()
            _synchronize(device)
            start = time.perf_counter()
            step()
            _synchronize(device)
            elapsed = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            samples[name].append(elapsed.item())
    return {name: statistics.median(values) for name, values in samples.items()}


def _inputs(length, heads, head_dim, dtype, device, seed):
    generator = torch.Generator().manual_seed(seed)
    shape = (1, length, heads, head_dim)
    q, k, v, logits, grad_output = (torch.randn(shape, generator=generator) for _ in range(5))
    k = k / head_dim**0.5
    g = torch.nn.functional.logsigmoid(logits + 3.0) / 16
    tensors = [tensor.to(device=device, dtype=dtype) for tensor in (q, k, v, grad_output)]
    return tensors[0], tensors[1], tensors[2], g.to(device), tensors[3]


def _leaves(tensors):
    return [tensor.clone().requires_grad_(True) for tensor in tensors]


def _layer_step(inputs, method, blocks, backend):
    q, k, v, g = _leaves(inputs[:4])
    grad_output = inputs[4]

    def step():
        o, _ = sequence_parallel_chunk_gla(q, k, v, g, group=None, method=method, scan_blocks=blocks, backend=backend)
        o.backward(grad_output)

    return step


def _one_device_step(inputs, backend):
    q, k, v, g = _leaves(inputs[:4])
    grad_output = inputs[4]

    def step():
        o, _ = chunk_gla(q, k, v, g, backend=backend)
        o.backward(grad_output)

    return step


def _rank_work_step(inputs, backend, forward_local_term: bool, backward_local_term: bool):
    """One rank's compute, without communication: the local terms it reads and its finish from a given state."""
    q, k, v, g, grad_output = (tensor.contiguous() for tensor in inputs)
    implementation = implementation_for(backend, q)
    scale = q.shape[-1] ** -0.5
    state = torch.randn(1, q.shape[2], q.shape[3], v.shape[3], device=q.device) * 0.1

    def step():
        prepared = implementation.prepare_forward(q, k, v, g)
        implementation.total_log_decay(prepared).exp()
        if forward_local_term:
            implementation.local_final_state(prepared)
        implementation.finish_forward(prepared, q, k, v, g, scale, state, False)
        prepared = implementation.prepare_backward(q, k, v, g, grad_output, scale, None)
        if backward_local_term:
            implementation.local_initial_state_gradient(prepared)
        implementation.finish_backward(prepared, q, k, v, g, scale, state, grad_output, state, None)

    return step


def _phases_step(inputs, backend):
    """The single-device operator's own phases, without autograd: the peer of the rank-work rows."""
    q, k, v, g, grad_output = (tensor.contiguous() for tensor in inputs)
    implementation = implementation_for(backend, q)
    scale = q.shape[-1] ** -0.5

    def step():
        implementation.forward(q, k, v, g, scale, None, False)
        implementation.backward(q, k, v, g, scale, None, grad_output, None, None)

    return step


def _scan_step(state_shape, method, blocks, device):
    local = torch.randn(state_shape, device=device)
    decay = DiagonalDecay(torch.rand(*state_shape[:3], 1, device=device))
    config = ScanConfig(group=None, method=method, scan_blocks=blocks, output_final_state=False)

    def step():
        scan_states(local, decay, None, config, ScanDirection.FORWARD)
        scan_states(local, decay, None, config, ScanDirection.REVERSE)

    return step


def _worker(rank, world_size, init_file, arguments, result_file):
    device = torch.device(arguments.device, rank) if arguments.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    backend = "triton" if device.type == "cuda" else "torch"
    dtype = DTYPES[arguments.dtype]
    length, heads, head_dim = arguments.length_per_rank, arguments.heads, arguments.head_dim
    inputs = _inputs(length, heads, head_dim, dtype, device, seed=rank)
    variants = method_variants(arguments.blocks, head_dim) if world_size > 1 else [(SequenceParallelMethod.ALLSCAN, 1)]
    steps = {("layer", method.value, blocks): _layer_step(inputs, method, blocks, backend) for method, blocks in variants}
    steps[("one-device", "-", 0)] = _one_device_step(inputs, backend) if rank == 0 else (lambda: None)
    if world_size == 1:
        steps[("rank-work", "end", 0)] = _rank_work_step(inputs, backend, True, False)
        steps[("rank-work", "middle", 0)] = _rank_work_step(inputs, backend, True, True)
        steps[("one-device-phases", "-", 0)] = _phases_step(inputs, backend)
    else:
        state_shape = (1, heads, head_dim, head_dim)
        for method, blocks in variants:
            steps[("scan", method.value, blocks)] = _scan_step(state_shape, method, blocks, device)
    timings = time_interleaved(steps, device, arguments.warmup, arguments.iterations)
    rows = [
        dict(kind=kind, ranks=world_size, length_per_rank=length, heads=heads, head_dim=head_dim, dtype=arguments.dtype,
             method=method, blocks=blocks, ms=milliseconds)
        for (kind, method, blocks), milliseconds in timings.items()
    ]
    if rank == 0:
        with open(result_file, "w") as handle:
            json.dump(rows, handle)
    dist.destroy_process_group()


def summary_table(rows: list[dict]) -> str:
    """A Markdown table of the rows: each layer row with its ratio to one-device in its job, each rank-work row
    with its ratio to one-device-phases (the same operator without autograd)."""
    one_device = {row["ranks"]: row["ms"] for row in rows if row["kind"] == "one-device"}
    phases = {row["ranks"]: row["ms"] for row in rows if row["kind"] == "one-device-phases"}
    lines = [
        "| what | ranks | tokens per rank | method | blocks | ms (fwd+bwd, median of slowest rank) | vs its peer |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        peer = {"layer": one_device, "rank-work": phases}.get(row["kind"], {}).get(row["ranks"])
        ratio = f"{row['ms'] / peer:.3f}x" if peer else "-"
        lines.append(
            f"| {row['kind']} | {row['ranks']} | {row['length_per_rank']} | {row['method']} | {row['blocks'] or '-'} "
            f"| {row['ms']:.3f} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--length-per-rank", type=int, default=1024, help="tokens each rank holds (weak scaling)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16], help="All-Scan block counts")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--json", help="also write the rows here")
    arguments = parser.parse_args(argv)
    if arguments.device == "cuda" and max(arguments.ranks) > torch.cuda.device_count():
        parser.error(f"--ranks {max(arguments.ranks)} needs as many GPUs; {torch.cuda.device_count()} visible")
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
    print(summary_table(rows))
    if arguments.json:
        with open(arguments.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return rows


if __name__ == "__main__":
    main()
