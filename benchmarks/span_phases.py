"""Where a sequence-parallel rank's time goes: the kernels of one rank's step against one device's, profiled.

One process, one GPU, no communication. ``one-device`` runs the GLA operator's own forward and backward phases;
``end-rank`` runs what either rank of a two-rank group computes ([Note: span phases] in
kernels/common/function.py, [Note: local terms on demand] in runtime/sequence_parallel.py): its local term in
one direction and its finish from a given incoming state and final-state gradient. The profile runs
one-device, end-rank, one-device, so a clock that drifts shows as a difference between the two one-device
tables. Prints each profile's kernel table and total kernel time per step.

    python3 benchmarks/span_phases.py --length 32768
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from schedlang.kernels.gla.chunk import implementation_for


def _operands(length: int, heads: int, head_dim: int):
    generator = torch.Generator().manual_seed(0)
    shape = (1, length, heads, head_dim)
    q, k, v, do, logits = (torch.randn(shape, generator=generator) for _ in range(5))
    tensors = [tensor.to("cuda", torch.bfloat16) for tensor in (q, k / head_dim**0.5, v, do)]
    g = (torch.nn.functional.logsigmoid(logits + 3) / 16).to("cuda")
    return (*tensors[:3], g, tensors[3])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    arguments = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    q, k, v, g, do = _operands(arguments.length, arguments.heads, arguments.head_dim)
    implementation = implementation_for("triton", q)
    scale = arguments.head_dim**-0.5
    state = torch.randn(1, arguments.heads, arguments.head_dim, arguments.head_dim, device="cuda") * 0.1

    def one_device():
        implementation.forward(q, k, v, g, scale, None, False)
        implementation.backward(q, k, v, g, scale, None, do, None, None)

    def end_rank():
        prepared = implementation.prepare_forward(q, k, v, g)
        implementation.local_final_state(prepared)
        implementation.total_log_decay(prepared).exp()
        implementation.finish_forward(prepared, q, k, v, g, scale, state, False)
        prepared = implementation.prepare_backward(q, k, v, g, do, scale, None)
        implementation.finish_backward(prepared, q, k, v, g, scale, state, do, state, None)

    for name, step in (("one-device", one_device), ("end-rank", end_rank), ("one-device", one_device)):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            for _ in range(arguments.steps):
                step()
            torch.cuda.synchronize()
        events = profiler.key_averages()
        kernel_us = sum(event.self_device_time_total for event in events) / arguments.steps
        print(f"== {name}, T={arguments.length}: {kernel_us / 1e3:.3f} ms of kernels per step")
        print(events.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=40))


if __name__ == "__main__":
    main()
