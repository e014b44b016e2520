"""One pipeline stage on one GPU: eager chunks vs per-chunk graph slots vs step graphs (issue 18).

Each system is the same schedule with a different ``pipeline.cuda_graphs`` (``false``, ``true``, ``step``),
compiled as ``schedlang compile`` compiles it, on ``mesh { pipeline = 1 }``: the stage is first and last, so
no point-to-point messages, only its chunks' graphs and memory. Per system, in one process and one after the
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

from benchmarks.common import add_stage_model_arguments, launch_single_stage, release, single_rank_environment  # noqa: E402
from benchmarks.pipeline_schedule import compile_schedule_text  # noqa: E402

SCHEDULE = """schedule graph_modes
model {{ vocab = {vocab}  d_model = {d_model}  layers = [gla] * {layers}  heads = {heads}  head_dim = {head_dim}
  mlp = swiglu(ratio = 2.6666666666666665) }}
mesh {{ pipeline = 1 }}
sequence {{ length = {length}  chunks = {chunks} }}
pipeline {{ microbatches = {microbatches}  order = 1f1b  cuda_graphs = {graphs} }}
train {{ steps = {steps}  dtype = {dtype}  optimizer = adamw(lr = 1e-4)  data = synthetic(seed = 1) }}
"""


def measure(args: argparse.Namespace, chunks: int, graphs: str) -> dict:
    text = SCHEDULE.format(
        vocab=args.vocab, d_model=args.d_model, layers=args.layers, heads=args.heads, head_dim=args.head_dim,
        length=args.length, chunks=chunks, microbatches=args.microbatches, graphs=graphs, steps=args.steps,
        dtype=args.dtype,
    )
    device = torch.device("cuda")
    trainer = launch_single_stage(compile_schedule_text(text))
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
    add_stage_model_arguments(parser, "GLA blocks on the stage (half the 1B model)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timed", type=int, default=3, help="the last steps whose median is reported")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark measures CUDA graphs: it needs a GPU")
    single_rank_environment(29533)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, {args.layers} GLA blocks d={args.d_model}, "
          f"{args.microbatches} x {args.length} tokens, {args.dtype}")
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
