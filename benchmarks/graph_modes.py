"""One pipeline stage on one GPU: eager chunks vs per-chunk graph slots vs step graphs (issue 18).

Each system is the schedule file ``--schedule`` (benchmarks/schedules/gla_8_blocks_one_stage.sched, on
``mesh { pipeline = 1 }``: the stage is first and last, so no point-to-point messages, only its chunks' graphs
and memory) revised to ``--length``, ``--microbatches``, ``--steps``, the chunk count and its
``pipeline.cuda_graphs`` (``false``, ``true``, ``step``), compiled as ``schedlang compile`` compiles it. Per system, in one process and one after the
other: the median step time over the last ``--timed`` of ``--steps`` steps (optimizer step included), the
reserved and allocated peaks (``torch.cuda.max_memory_reserved`` sees graph pools whole), and each step's
loss, which must agree across systems (same seed, same data).

    python3 benchmarks/graph_modes.py --length 32768 --chunks 8 16 --systems false true step

A single process group of one rank is created here (no torchrun needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import launch_single_stage, release, single_rank_environment  # noqa: E402
from benchmarks.pipeline_schedule import SCHEDULES_DIRECTORY, runtime_configs  # noqa: E402

STAGE_SCHEDULE = SCHEDULES_DIRECTORY / "gla_8_blocks_one_stage.sched"


def system_program(args: argparse.Namespace, chunks: int, graphs: str):
    """The checked program of one system: the file revised on its keys."""
    from schedlang.compiler import revise
    from schedlang.frontend import load_program

    return revise(
        load_program(args.schedule), length=args.length, chunks=chunks, microbatches=args.microbatches,
        cuda_graphs=graphs, steps=args.steps,
    )


def measure(args: argparse.Namespace, chunks: int, graphs: str) -> dict:
    device = torch.device("cuda")
    trainer = launch_single_stage(runtime_configs(system_program(args, chunks, graphs)))
    losses, seconds = [], []
    for step in range(args.steps):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        loss = trainer.forward_backward(step)
        trainer.optimizer_step()
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
        losses.append(float(loss))
    record = {
        "chunks": chunks,
        "cuda_graphs": graphs,
        "step_seconds": statistics.median(seconds[-args.timed :]),
        "tokens_per_second": args.microbatches * args.length / statistics.median(seconds[-args.timed :]),
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        "losses": losses,
    }
    del trainer
    torch.cuda.synchronize(device)
    release(device)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--chunks", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--systems", nargs="+", default=["false", "true", "step"], choices=["false", "true", "step"])
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default=str(STAGE_SCHEDULE), help="the schedule file every system revises")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timed", type=int, default=3, help="the last steps whose median is reported")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark measures CUDA graphs: it needs a GPU")
    single_rank_environment(29533)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, {args.schedule}, "
          f"{args.microbatches} x {args.length} tokens")
    for chunks in args.chunks:
        records = [measure(args, chunks, graphs) for graphs in args.systems]
        eager = next((record for record in records if record["cuda_graphs"] == "false"), records[0])
        for record in records:
            record["time_vs_first"] = record["step_seconds"] / eager["step_seconds"]
            record["reserved_vs_first"] = record["peak_reserved_gib"] / eager["peak_reserved_gib"]
            print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
