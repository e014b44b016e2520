"""The memory model's predicted peaks against the measured ones, one pipeline stage on one GPU (issue 18).

Each case is the schedule file ``--schedule`` (benchmarks/schedules/gla_8_blocks_one_stage.sched, on
``mesh { pipeline = 1 }``: the stage is first and last) revised on the case's keys (:data:`CASES`) and to
``--length``, ``--microbatches`` and ``--steps``: the model's prediction
(:func:`schedlang.lowering.memory_peak.predict_memory`, what ``schedlang simulate`` prints) is set beside the
measured ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` over ``--steps`` training steps
(optimizer steps included, so Adam's state is live), the run compiled exactly as ``schedlang compile``
compiles it. One JSON line per case, then a table with measured / predicted for allocated and reserved.

    python3 benchmarks/memory_model.py                       # the default cases, 8 GLA blocks d=2048, 4 x 16K
    python3 benchmarks/memory_model.py --cases gla-c8 gdn-c8 --length 32768

A single process group of one rank is created here (no torchrun needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import launch_single_stage, release, single_rank_environment  # noqa: E402
from benchmarks.pipeline_schedule import SCHEDULES_DIRECTORY, runtime_configs  # noqa: E402
from schedlang.compiler import revise  # noqa: E402
from schedlang.frontend import load_program  # noqa: E402
from schedlang.lowering.memory_peak import predict_memory  # noqa: E402

GIB = 2**30
STAGE_SCHEDULE = SCHEDULES_DIRECTORY / "gla_8_blocks_one_stage.sched"

CASES = {
    # name: the keys the case changes; {n} is the file's layer count, {q} a quarter of it, {heads} its heads
    "gla-c4": {"chunks": "4"},
    "gla-c8": {},
    "gla-c16": {"chunks": "16"},
    "gla-c8-mlp": {"recompute": "mlp"},
    "gla-c8-full": {"recompute": "full"},
    "gla-c8-step": {"cuda_graphs": "step"},
    "gdn-c8": {"layers": "[gdn] * {n}"},
    "hybrid-c8": {"layers": "[gla, gla, gla, attn] * {q}"},
    # the attn layers' own heads: twice the model's query heads, each key/value head shared by two
    "hybrid-c8-gqa": {"layers": "[gla, gla, gla, attn] * {q}", "attn_heads": "{wide}", "attn_kv_heads": "{heads}",
                      "qkv_bias": "true"},
    # flash-linear-attention's Gated DeltaNet: grouped value heads (two per q/k head), short convolutions, Mamba-2
    # gates
    "gdn-c8-fla": {"layers": "[gdn] * {n}", "value_heads": "{wide}", "short_conv_size": "4", "delta_gates": "mamba"},
}


def case_program(args: argparse.Namespace, case: str):
    """The checked program of ``case``: the file revised on the case's keys and the command line's."""
    base = load_program(args.schedule)
    n, heads = len(base.model.layers), base.model.heads
    sizes = {"n": n, "q": max(1, n // 4), "heads": heads, "wide": 2 * heads}
    changes = {key: value.format(**sizes) for key, value in CASES[case].items()}
    return revise(base, length=args.length, microbatches=args.microbatches, steps=args.steps, **changes)


def measure(args: argparse.Namespace, case: str) -> dict:
    program = case_program(args, case)
    (predicted,) = predict_memory(program)
    device = torch.device("cuda")
    trainer = launch_single_stage(runtime_configs(program))
    losses = []
    for step in range(args.steps):
        losses.append(float(trainer.forward_backward(step)))
        trainer.optimizer_step()
    torch.cuda.synchronize(device)
    record = {
        "case": case,
        "measured_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "measured_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
        "predicted_allocated_gib": predicted.allocated / GIB,
        "predicted_reserved_gib": predicted.reserved / GIB,
        "predicted_components_gib": {part.value: value / GIB for part, value in predicted.components.items()},
        "losses": losses,
    }
    del trainer
    torch.cuda.synchronize(device)
    release(device)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default=str(STAGE_SCHEDULE), help="the schedule file every case revises")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the records to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark measures CUDA memory: it needs a GPU")
    single_rank_environment(29534)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, {args.schedule}, "
          f"{args.microbatches} x {args.length} tokens")
    records = []
    for case in args.cases:
        record = measure(args, case)
        records.append(record)
        print(json.dumps(record), flush=True)
    print("| case | allocated measured / predicted GiB | ratio | reserved measured / predicted GiB | ratio |")
    print("|---|---|---|---|---|")
    for r in records:
        print(f"| {r['case']} | {r['measured_allocated_gib']:.2f} / {r['predicted_allocated_gib']:.2f} | "
              f"{r['measured_allocated_gib'] / r['predicted_allocated_gib']:.3f} | "
              f"{r['measured_reserved_gib']:.2f} / {r['predicted_reserved_gib']:.2f} | "
              f"{r['measured_reserved_gib'] / r['predicted_reserved_gib']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
