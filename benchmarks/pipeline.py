"""StateFlow chunked pipelines vs torch.distributed.pipelining's Schedule1F1B at PP2 (issue 4).

One GLA language model (about 1B parameters at the defaults) is split into two
stages. schedlang's runtime runs it with each sequence cut into N chunks
(1F1B over chunks, states handed chunk to chunk); the peer is torch's own
``Schedule1F1B`` over full-sequence microbatches on the very same stage
modules, kernels and data. Reported per stage: tokens/s and peak memory
(total, and activations = peak minus the memory held after a warm-up step:
weights, gradients, optimizer state). Then each system's longest sequence
that fits (``longest_fitting_length``: from 64K, doubling until a length fails, then bisection in 16K steps),
one step per length, each attempt in a fresh torchrun job so an out-of-memory rank cannot wedge the next
attempt. Each schedlang system's measured reserved peak is printed beside the memory model's prediction
(``schedlang simulate``), in the throughput job and at each length of the search.

Issue 18's acceptance job (2 GPUs; ``torch+ckpt`` is Schedule1F1B with torch's activation checkpointing):
    python benchmarks/pipeline.py --out results/ --systems schedlang:chunks=8/cuda_graphs=step \
        schedlang:chunks=16/recompute=mlp schedlang:chunks=16/recompute=full torch torch+ckpt \
        --search-systems torch torch+ckpt schedlang:chunks=16/recompute=full \
        schedlang:chunks=32/recompute=mixer/offload=true

Each system is the schedule file ``--schedule`` (benchmarks/schedules/gla_1b_pp2.sched) revised on named keys
(benchmarks/pipeline_schedule.py: ``schedlang:chunks=16/recompute=full`` is the file with ``chunks = 16`` and
``recompute = full``; ``schedlang`` the file as it is), compiled as ``schedlang compile`` compiles it; the
benchmark runs the generated script's configs under its own timing loop, and writes each system's schedule
under ``--out`` (``schedlang run`` re-runs it). The torch peers take their model and stage split from the same
file. --first-stage-layers writes model { stages = ... }, --split-mlp model { layers = [gla, mlp] * 16 },
--length and --microbatches their keys; --cublas-workspace auto, the default, gives a job whose schedlang
systems all replay graphs, torch's too, no cuBLAS workspace, as schedlang's runtime gives its graph stages:
see job_environment.

Driver (plain python, launches torchrun jobs):
    python benchmarks/pipeline.py --out results/ [--device cuda] [--length 32768]
        [--systems schedlang:chunks=8 schedlang:chunks=8/cuda_graphs=true torch] [--first-stage-layers 9]
        [--split-mlp]
Worker (what the driver launches):
    torchrun --nproc-per-node 2 benchmarks/pipeline.py --worker --systems torch schedlang:chunks=16 --length 32768
A tiny CPU run of the whole path: python benchmarks/pipeline.py --device cpu --tiny --out /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    gib,
    kernel_seconds_of_step,
    longest_fitting_length,
    memory_now,
    model_state_bytes,
    peak_memory,
    peak_reserved,
    release,
    reserved_now,
    reset_peak,
    synchronize,
)
from benchmarks.pipeline_schedule import (  # noqa: E402
    PIPELINE_SCHEDULE,
    TORCH_CHECKPOINTED_SYSTEM,
    TORCH_SYSTEM,
    TORCH_SYSTEMS,
    BenchmarkSchedule,
    RuntimeConfigs,
    predicted_reserved_bytes,
    system_configs,
    system_file_name,
    system_program,
    variant_program,
)
from benchmarks.training_systems import (  # noqa: E402
    FullSequenceStage,
    SchedlangSystem,
    error_lines,
    full_sequence_loss,
    kernel_preflight,
    preflight,
    run_job,
    train_dtype,
)
from schedlang.vocabulary import CudaGraphs  # noqa: E402


class TorchSystem:
    """torch.distributed.pipelining.Schedule1F1B over full-sequence microbatches; with ``checkpointed``, torch's
    activation checkpointing wraps every block (non-reentrant ``checkpoint_wrapper``, as torchtitan applies it)."""

    def __init__(self, mesh, configs: RuntimeConfigs, microbatches: int, checkpointed: bool = False) -> None:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        from schedlang.runtime.data import TokenSource
        from schedlang.runtime.model import Block, build_stage_model
        from schedlang.runtime.trainer import DTYPES, build_optimizer, zero_gradients

        self.mesh = mesh
        config = configs.model
        layers = configs.pipeline.stage_layers[mesh.stage]
        model = build_stage_model(
            config, layers, mesh.is_first_stage, mesh.is_last_stage, 0, mesh.device, DTYPES[configs.train.dtype]
        )
        if checkpointed:
            apply_activation_checkpointing(model, check_fn=lambda module: isinstance(module, Block))
        self.module = FullSequenceStage(model)
        # the optimizer schedlang's trainer builds (fused AdamW on CUDA): only the schedules differ
        self.optimizer = build_optimizer(self.module.parameters(), configs.train)
        self.zero_gradients = zero_gradients
        stage = PipelineStage(self.module, stage_index=mesh.stage, num_stages=2, device=mesh.device)
        self.schedule = Schedule1F1B(stage, n_microbatches=microbatches, loss_fn=full_sequence_loss)
        length = configs.pipeline.chunk_boundaries[-1]
        self.tokens = TokenSource(configs.train.data, config.vocab, length, microbatches)
        self.step_index = 0

    def model_state_bytes(self) -> int:
        return model_state_bytes(self.module, self.optimizer)

    def step(self) -> None:
        tokens = self.tokens.global_batch_tokens(self.step_index).to(self.mesh.device)
        self.zero_gradients(self.optimizer)
        if self.mesh.is_first_stage:
            self.schedule.step(tokens[:, :-1])
        else:
            losses = []
            self.schedule.step(target=tokens[:, 1:], losses=losses)
        self.optimizer.step()
        self.step_index += 1

    def close(self) -> None:
        self.schedule = None


def build_system(name: str, mesh, schedule: BenchmarkSchedule, length: int, microbatches: int):
    configs = system_configs(schedule, name, length, microbatches, train_dtype(mesh.device.type))
    if name in TORCH_SYSTEMS:
        return TorchSystem(mesh, configs, microbatches, checkpointed=name == TORCH_CHECKPOINTED_SYSTEM)
    from schedlang.runtime.trainer import Trainer

    return SchedlangSystem(Trainer(configs.model, configs.pipeline, configs.train, mesh, timeout_s=600.0))


def job_environment(
    systems: list[str], device: str, cublas_workspace: str, schedule: BenchmarkSchedule
) -> tuple[dict[str, str], str]:
    """The environment of a torchrun job over ``systems``, and its cuBLAS workspace setting in words.

    [Note: GEMMs without a workspace in CUDA graphs] (schedlang.runtime.cublas): replayed graphs gain from no
    workspace, but eager chunks lose badly. Every system of a job shares one process and one setting,
    so ``auto`` gives no workspace only to a job whose schedlang systems all replay graphs, as schedlang's
    runtime does; ``none`` and ``default`` force one.
    """
    environment = dict(os.environ)
    if device != "cuda":
        return environment, "(CPU)"
    from schedlang.runtime.cublas import WORKSPACE_FREE_SETTINGS, use_workspace_free_gemms

    graphs_only = all(
        variant_program(schedule, name).pipeline.cuda_graphs for name in systems if name not in TORCH_SYSTEMS
    )
    if cublas_workspace == "none" or (cublas_workspace == "auto" and graphs_only):
        use_workspace_free_gemms(environment)
    return environment, ", ".join(f"{name}={environment.get(name, '(unset)')}" for name in WORKSPACE_FREE_SETTINGS)


def measure(
    name: str, mesh, schedule: BenchmarkSchedule, length: int, microbatches: int, warmup: int, steps: int,
    trace_dir: str | None = None,
) -> dict:
    device = mesh.device
    release(device)
    reset_peak(device)
    started_build = time.perf_counter()
    system = build_system(name, mesh, schedule, length, microbatches)
    if name not in TORCH_SYSTEMS and variant_program(schedule, name).pipeline.cuda_graphs is CudaGraphs.STEP:
        warmup = max(warmup, 2)  # [Note: step graphs]: the first step runs eagerly, the second captures
    for _ in range(warmup):
        system.step()
    synchronize(device)
    dist.barrier()
    resident = memory_now(device)
    reset_peak(device)
    started = time.perf_counter()
    for _ in range(steps):
        system.step()
    synchronize(device)
    dist.barrier()
    elapsed = time.perf_counter() - started
    record = {
        "system": name,
        "length": length,
        "stage": mesh.stage,
        "tokens_per_second": microbatches * length * steps / elapsed,
        "step_seconds": elapsed / steps,
        "peak_bytes": peak_memory(device),
        "peak_reserved_bytes": peak_reserved(device),
        "resident_bytes": resident,
        "activation_peak_bytes": peak_memory(device) - resident,
        # CUDA-graph slots keep their activations in pools allocated at capture, inside `resident`: for those
        # systems only this figure (peak minus weights, gradients and optimizer state; P2P buffers and graph
        # pools count as activations) says what the chunks hold
        "peak_minus_model_state_bytes": peak_memory(device) - system.model_state_bytes() if device.type == "cuda" else 0,
        "setup_seconds": started - started_build,
    }
    trace_name = f"trace-{system_file_name(name).removesuffix('.sched')}-stage{mesh.stage}.json"
    trace = Path(trace_dir) / trace_name if trace_dir else None
    record["kernel_seconds"], record["communication_kernel_seconds"], record["kernels"] = kernel_seconds_of_step(
        system.step, device, trace
    )
    system.close()
    del system
    release(device)
    # what the finished system left reserved: a leak (graph pools kept alive by a reference cycle) shows here
    # and inflates every later system's memory figures
    record["reserved_after_release_bytes"] = reserved_now(device)
    return record


def worker(args: argparse.Namespace) -> int:
    from schedlang.runtime.mesh import init_mesh

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    mesh = init_mesh(2, 1, 1, args.device, timeout_s=600.0)
    schedule = benchmark_schedule(args)
    records = []
    for name in args.systems:
        record = measure(
            name, mesh, schedule, args.length, args.microbatches, args.warmup, args.steps, args.trace_dir
        )
        gathered = [None, None]
        dist.all_gather_object(gathered, record)
        records.extend(gathered)
        if mesh.rank == 0:
            print(json.dumps(gathered), flush=True)
    if mesh.rank == 0 and args.result:
        Path(args.result).write_text(json.dumps(records, indent=1), encoding="utf-8")
    dist.destroy_process_group()
    return 0


def launch_worker(args, systems, length, warmup, steps, result: Path, timeout: float) -> tuple[int, list]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(Path(__file__).resolve()), "--worker", "--device", args.device, "--length", str(length),
        "--microbatches", str(args.microbatches), "--warmup", str(warmup), "--steps", str(steps),
        "--result", str(result), "--schedule", str(args.schedule), "--systems", *systems,
    ] + (["--tiny"] if args.tiny else []) + (
        ["--first-stage-layers", str(args.first_stage_layers)] if args.first_stage_layers is not None else []
    ) + (["--trace-dir", args.trace_dir] if args.trace_dir else []) + (["--split-mlp"] if args.split_mlp else [])
    schedule = benchmark_schedule(args)
    environment, _ = job_environment(systems, args.device, args.cublas_workspace, schedule)
    code, records, output = run_job(command, environment, timeout, result)
    if code != 0:
        print(f"  [{' '.join(systems)} at {length}: exit {code}] {error_lines(output)}", flush=True)
    return code, records


def activation_ratio(mine: list[dict], peer: list[dict], key: str) -> float:
    """The largest stage's figure over the peer's largest stage's."""
    return max(record[key] for record in mine) / max(max(record[key] for record in peer), 1)


def summary_lines(header: str, systems: list[str], records: list[dict], graph_systems: set[str]) -> list[str]:
    """The throughput job's table (one row per system and stage) and each schedlang system's ratios to torch.

    "NCCL kernels" is the time NCCL kernels were resident on the GPU in the profiled step: a send or receive
    posted long before its peer's keeps one there, and the compute kernels beside it run slower
    (docs/benchmarks.md, "Measurements behind the pipeline orders", [Note: forward before weight gradients]).
    ``graph_systems`` names the systems that replay CUDA graphs.
    """
    lines = [
        header,
        "| system | stage | tokens/s | step (s) | compute kernels (s) | busy | NCCL kernels (s) | peak (GiB) |"
        " activations peak (GiB) | peak - model state (GiB) | reserved peak (GiB) | left reserved (GiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for record in records:
        lines.append(
            f"| {record['system']} | {record['stage']} | {record['tokens_per_second']:,.0f} | "
            f"{record['step_seconds']:.2f} | {record.get('kernel_seconds', 0.0):.2f} | "
            f"{record.get('kernel_seconds', 0.0) / record['step_seconds']:.0%} | "
            f"{record.get('communication_kernel_seconds', 0.0):.3f} | "
            f"{gib(record['peak_bytes'])} | {gib(record['activation_peak_bytes'])} | "
            f"{gib(record['peak_minus_model_state_bytes'])} | {gib(record.get('peak_reserved_bytes', 0))} | "
            f"{gib(record.get('reserved_after_release_bytes', 0))} |"
        )
    torch_records = [record for record in records if record["system"] == TORCH_SYSTEM]
    if not torch_records:
        return lines
    torch_rate = min(record["tokens_per_second"] for record in torch_records)
    for name in systems:
        mine = [record for record in records if record["system"] == name]
        if name in TORCH_SYSTEMS or not mine:
            continue
        rate = min(record["tokens_per_second"] for record in mine)
        lines.append(
            f"{name}: throughput x{rate / torch_rate:.3f} of Schedule1F1B, "
            f"activation peak x{activation_ratio(mine, torch_records, 'activation_peak_bytes'):.2f}, "
            f"peak - model state x{activation_ratio(mine, torch_records, 'peak_minus_model_state_bytes'):.2f}, "
            f"reserved peak x{activation_ratio(mine, torch_records, 'peak_reserved_bytes'):.2f}"
            + (" (graph pools: only the reserved peak sees them whole)" if name in graph_systems else "")
        )
    return lines


def prediction_lines(systems: list[str], records: list[dict], predicted: dict[str, tuple[float, ...]]) -> list[str]:
    """Each schedlang system's measured reserved peak per stage over the memory model's prediction."""
    lines = []
    for name in systems:
        if name not in predicted:
            continue
        stages = sorted((record for record in records if record["system"] == name), key=lambda r: r["stage"])
        if not stages:
            continue
        pairs = ", ".join(
            f"stage {record['stage']} {gib(record.get('peak_reserved_bytes', 0))} / "
            f"{gib(predicted[name][record['stage']])} GiB (x{record.get('peak_reserved_bytes', 0) / predicted[name][record['stage']]:.3f})"
            for record in stages
        )
        lines.append(f"{name}: reserved peak measured / predicted: {pairs}")
    return lines


def driver(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.trace_dir:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    backend = kernel_preflight(args.device, Path(__file__).resolve(), args.allow_torch_kernels)
    os.environ["SCHEDLANG_KERNEL_BACKEND"] = backend
    systems = list(args.systems)
    schedule, dtype = benchmark_schedule(args), train_dtype(args.device)
    programs = {  # the checker refuses a bad system here, before any job starts
        name: system_program(schedule, name, args.length, args.microbatches, dtype)
        for name in dict.fromkeys(systems + list(args.search_systems))
    }
    for name, program in programs.items():
        (out / system_file_name(name)).write_text(program.source_text, encoding="utf-8")
    predicted = {name: predicted_reserved_bytes(programs[name]) for name in systems if name not in TORCH_SYSTEMS}
    graph_systems = {name for name in systems if name not in TORCH_SYSTEMS and programs[name].pipeline.cuda_graphs}
    split = programs[systems[0]].stage_layers
    _, workspace = job_environment(systems, args.device, args.cublas_workspace, schedule)
    code, records = launch_worker(
        args, systems, args.length, args.warmup, args.steps, out / "throughput.json", args.throughput_timeout
    )
    header = (
        f"kernel backend: {backend}; length {args.length}, {args.microbatches} microbatches, PP2, "
        f"{'layer-list entries ([gla, mlp] * L)' if args.split_mlp else 'layers'} per stage "
        f"{len(split[0])} + {len(split[1])} (+ head and loss); cuBLAS, both systems: {workspace}"
    )
    lines = summary_lines(header, systems, records, graph_systems) + prediction_lines(systems, records, predicted)
    print("\n".join(lines), flush=True)
    fits = {}
    for name in args.search_systems:

        def fits_at(length: int, name: str = name) -> bool:
            if time.monotonic() - started > args.budget:
                raise TimeoutError(f"time budget spent before {name} at {length}")
            code, found = launch_worker(args, [name], length, 0, 1, out / "fit.json", args.search_timeout)
            if code != 0:
                print(f"  {name} does not fit {length} tokens", flush=True)
                return False
            peak = max(record["peak_bytes"] for record in found)
            reserved = max(record.get("peak_reserved_bytes", 0) for record in found)
            forecast = ""
            if name not in TORCH_SYSTEMS:
                program = system_program(schedule, name, length, args.microbatches, dtype)
                forecast = f", predicted {gib(max(predicted_reserved_bytes(program)))} GiB"
            print(f"  {name} fits {length} tokens (peak {gib(peak)} GiB, reserved {gib(reserved)} GiB{forecast})",
                  flush=True)
            fits[name] = (length, peak)
            return True

        try:
            longest_fitting_length(fits_at, args.search_start, args.search_step, args.search_max)
        except TimeoutError as error:
            print(f"  {error}; {name}'s search stops at what it found", flush=True)
    for name in args.search_systems:
        fit = fits.get(name)
        text = f"{fit[0]} tokens (peak {gib(fit[1])} GiB)" if fit else "no tried length fit (or none was tried)"
        lines.append(f"longest fitting sequence of those tried, {name}: {text}")
    summary = "\n".join(lines)
    (out / "summary.md").write_text(summary + "\n", encoding="utf-8")
    print(summary)
    return 0


def benchmark_schedule(args: argparse.Namespace) -> BenchmarkSchedule:
    """The schedule the options ask for: --schedule, --tiny, --split-mlp, --first-stage-layers."""
    return BenchmarkSchedule(Path(args.schedule), args.tiny, args.split_mlp, args.first_stage_layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--preflight", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--allow-torch-kernels", action="store_true",
                        help="on a GPU whose Triton kernels fail the preflight, measure the PyTorch kernels "
                        "instead of stopping")
    parser.add_argument("--tiny", action="store_true", help="a tiny model, to check the whole path on CPU")
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--first-stage-layers", type=int, help="layers on stage 0, the rest on stage 1 (default: half)")
    parser.add_argument(
        "--split-mlp", action="store_true", help="layers [gla, mlp] * L: stages may end between a mixer and its MLP"
    )
    parser.add_argument("--schedule", default=str(PIPELINE_SCHEDULE), help="the schedule file every system revises")
    parser.add_argument(
        "--systems", nargs="+", default=[*(f"schedlang:chunks={n}" for n in (1, 4, 8, 16)), TORCH_SYSTEM],
        help="the throughput job's systems: torch, torch+ckpt, schedlang (the file as it is) or "
        "schedlang:<key>=<value>/... (the file with those keys changed: schedlang:chunks=8/cuda_graphs=true)",
    )
    parser.add_argument("--trace-dir", help="write each system's profiled step per stage as a Chrome trace here")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--result", default=None)
    parser.add_argument("--out", default="benchmark-results")
    parser.add_argument("--search-systems", nargs="*", default=[TORCH_SYSTEM, "schedlang:chunks=16"])
    parser.add_argument("--search-start", type=int, default=65536, help="the length search's first length")
    parser.add_argument("--search-step", type=int, default=16384, help="the length search's granularity")
    parser.add_argument("--search-max", type=int, default=1048576, help="the longest length the search tries")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds after which the length search stops")
    parser.add_argument("--throughput-timeout", type=float, default=300.0)
    parser.add_argument(
        "--cublas-workspace", choices=("auto", "none", "default"), default="auto",
        help="auto: no cuBLAS workspace (both systems) in a job whose schedlang systems all replay CUDA graphs, "
        "as schedlang's runtime does (schedlang.runtime.cublas), torch's default otherwise; none / default: "
        "force one for every job",
    )
    parser.add_argument("--search-timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.preflight:
        return preflight()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
