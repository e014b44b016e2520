"""Where one pipeline stage's forward+backward spends its GPU time, and what chunking adds (torch.profiler).

Builds a stage of benchmarks/pipeline.py's model (stage 0: embedding + the first half of the layers; stage 1:
the second half + final norm, LM head and loss), or of any schedule's (``--schedule``: a one-stage file's stage 0
is the whole model), runs one microbatch of a full sequence as the runtime's
executor does (each chunk's forward keeps its graph and hands its states on; the backwards run chunk by chunk
in reverse, each taking the next chunk's state gradients), after a warm-up, and prints the CUDA kernels by
total time for each chunk count, with the difference from the first count: the GPU work that chunking adds.

    python benchmarks/profile_stage.py [--stage 1] [--length 32768] [--chunks 1 8] [--top 25] [--python-profile]
        [--in-place-weight-gradients] [--schedule FILE] [--device cpu]
    python benchmarks/profile_stage.py --schedule benchmarks/schedules/mamba2_1b_one_device.sched --length 65536 --chunks 1 16

With --device cpu the table is CPU operators by self time (what a test runs: the GPU's kernel table is the point
of the script).

--in-place-weight-gradients runs the linear layers as CUDA-graph stages do ([Note: in-place weight gradients]:
the weight-gradient GEMM adds into ``.grad``), so the table shows what chunking adds to those stages.

--python-profile adds where the host's time goes (cProfile of one more forward+backward at the last chunk
count, by own time): with many chunks a stage is host-bound when wall time far exceeds the kernels' total.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import synchronize, time_by_family  # noqa: E402
from benchmarks.pipeline_schedule import (  # noqa: E402
    PIPELINE_SCHEDULE,
    TORCH_SYSTEM,
    BenchmarkSchedule,
    system_configs,
)


def run_once(model, inputs, targets, n_chunks: int, upstream) -> None:
    """One microbatch in ``n_chunks`` chunks: forwards in order, then backwards in reverse, as the executor."""
    states = [None] * model.n_states
    records = []
    pieces = zip(inputs.chunk(n_chunks, dim=1), targets.chunk(n_chunks, dim=1), upstream.chunk(n_chunks, dim=1))
    for piece, piece_targets, piece_upstream in pieces:
        leaves = [None if state is None else state.detach().requires_grad_(True) for state in states]
        hidden, states = model(piece, leaves)
        if model.final_norm is not None:
            output, gradient = model.loss(hidden, piece_targets) / targets.numel(), None
        else:
            output, gradient = hidden, piece_upstream
        records.append((output, gradient, leaves, states))
    state_grads = None
    for output, gradient, leaves, states in reversed(records):
        tensors, grads = [output], [gradient]
        if state_grads is not None:
            tensors += [state for state in states if state is not None]
            grads += [grad for state, grad in zip(states, state_grads) if state is not None]
        torch.autograd.backward(tensors, grads)
        state_grads = [None if leaf is None else leaf.grad for leaf in leaves]


def kernel_totals(step, device: torch.device) -> tuple[dict[str, float], int]:
    """Milliseconds per CUDA kernel name over one call of ``step``, and how many kernels ran; on a CPU device,
    per operator by self time, and how many operators ran."""
    on_cuda = device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if on_cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as profiler:
        step()
        synchronize(device)
    totals: dict[str, float] = {}
    launches = 0
    for event in profiler.events():
        if on_cuda and event.device_type == torch.autograd.DeviceType.CUDA:
            milliseconds = event.device_time_total / 1e3
        elif not on_cuda and event.device_type == torch.autograd.DeviceType.CPU:
            milliseconds = event.self_cpu_time_total / 1e3
        else:
            continue
        totals[event.name] = totals.get(event.name, 0.0) + milliseconds
        launches += 1
    return totals, launches


def main(argv: list[str] | None = None) -> int:
    from schedlang.runtime.linear import accumulate_weight_gradients_into_grad
    from schedlang.runtime.model import build_stage_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", type=Path, default=PIPELINE_SCHEDULE, help="the schedule whose model to build")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--stage", type=int, default=0)
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--python-profile", action="store_true", help="also print cProfile's top host functions")
    parser.add_argument("--first-stage-layers", type=int, help="as benchmarks/pipeline.py's (default: half)")
    parser.add_argument("--split-mlp", action="store_true", help="as benchmarks/pipeline.py's")
    parser.add_argument(
        "--in-place-weight-gradients", action="store_true", help="linear layers add weight gradients into .grad"
    )
    args = parser.parse_args(argv)
    schedule = BenchmarkSchedule(args.schedule, split_mlp=args.split_mlp, first_stage_layers=args.first_stage_layers)
    dtype_name, dtype = ("bf16", torch.bfloat16) if args.device == "cuda" else ("fp32", torch.float32)
    configs = system_configs(schedule, TORCH_SYSTEM, args.length, 1, dtype_name)
    config = configs.model
    device = torch.device(args.device)
    stages = len(configs.pipeline.stage_layers)
    if not 0 <= args.stage < stages:
        parser.error(f"--stage {args.stage}: {args.schedule} has {stages} stage(s), 0 to {stages - 1}")
    first, last = args.stage == 0, args.stage == stages - 1
    layers = configs.pipeline.stage_layers[args.stage]
    model = build_stage_model(config, layers, first, last, 0, device, dtype)
    tokens = torch.randint(0, config.vocab, (1, args.length + 1), device=device)
    if first:
        inputs = tokens[:, :-1]
    else:
        inputs = torch.randn(1, args.length, config.d_model, device=device, dtype=dtype)
    targets = tokens[:, 1:]
    if args.in_place_weight_gradients:
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        accumulate_weight_gradients_into_grad(model)
    upstream = torch.randn(1, args.length, config.d_model, device=device, dtype=dtype)
    parameters = sum(p.numel() for name, p in model.named_parameters() if "embedding" not in name)
    flops = 6 * parameters * args.length
    columns = {}
    for n_chunks in args.chunks:
        def step():
            run_once(model, inputs, targets, n_chunks, upstream)
        step()
        synchronize(device)
        started = time.perf_counter()
        step()
        synchronize(device)
        wall = time.perf_counter() - started
        columns[n_chunks], launches = kernel_totals(step, device)
        work_ms = sum(columns[n_chunks].values())
        work = "GPU kernels" if device.type == "cuda" else "CPU operators' self time"
        print(f"stage {args.stage}, {args.length} tokens in {n_chunks} chunk(s): wall {wall * 1e3:.1f} ms, "
              f"{work} {work_ms:.1f} ms in {launches} launches, {flops / wall / 1e12:.3g} TFLOP/s of "
              "6*params*tokens")
    base = args.chunks[0]
    names = sorted(set().union(*columns.values()), key=lambda name: -max(column.get(name, 0.0) for column in columns.values()))
    header = " | ".join(f"{n} chunks (ms)" for n in args.chunks)
    differences = " | ".join(f"{n} - {base}" for n in args.chunks[1:])
    print(f"| kernel | {header} | {differences} |")
    print("|---|" + "---|" * (2 * len(args.chunks) - 1))
    for name in names[: args.top]:
        values = [columns[n].get(name, 0.0) for n in args.chunks]
        cells = " | ".join(f"{value:.2f}" for value in values) + " | " + " | ".join(f"{value - values[0]:+.2f}" for value in values[1:])
        print(f"| {name[:80]} | {cells} |")
    totals = [sum(columns[n].values()) for n in args.chunks]
    print("| total | " + " | ".join(f"{total:.2f}" for total in totals) + " | "
          + " | ".join(f"{total - totals[0]:+.2f}" for total in totals[1:]) + " |")
    families = {n: time_by_family(columns[n]) for n in args.chunks}
    order = sorted(set().union(*families.values()), key=lambda family: -families[base].get(family, 0.0))
    print(f"\n| kernel family | {header} | {differences} |")
    print("|---|" + "---|" * (2 * len(args.chunks) - 1))
    for family in order:
        values = [families[n].get(family, 0.0) for n in args.chunks]
        cells = " | ".join(f"{value:.2f}" for value in values) + " | " + " | ".join(f"{value - values[0]:+.2f}" for value in values[1:])
        print(f"| {family} | {cells} |")
    if args.python_profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run_once(model, inputs, targets, args.chunks[-1], upstream)
        profiler.disable()
        synchronize(device)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
