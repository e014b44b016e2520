"""The memory model's predicted peaks against the measured ones, one pipeline stage on one GPU (issue 18).

Each case is a schedule on ``mesh { pipeline = 1 }`` (the stage is first and last): the model's prediction
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

from benchmarks.common import add_stage_model_arguments, launch_single_stage, release, single_rank_environment  # noqa: E402
from benchmarks.pipeline_schedule import compile_schedule_text  # noqa: E402
from schedlang.compiler import Pass, ScheduleText, compile_schedule  # noqa: E402
from schedlang.lowering.memory_peak import predict_memory  # noqa: E402

GIB = 2**30

SCHEDULE = """schedule memory_model
model {{ vocab = {vocab}  d_model = {d_model}  layers = {layers}  heads = {heads}  head_dim = {head_dim}
  mlp = swiglu(ratio = 2.6666666666666665) {extra_keys} }}
mesh {{ pipeline = 1 }}
sequence {{ length = {length}  chunks = {chunks} }}
pipeline {{ microbatches = {microbatches}  order = 1f1b  cuda_graphs = {graphs}  recompute = {recompute} }}
train {{ steps = {steps}  dtype = {dtype}  optimizer = adamw(lr = 1e-4)  data = synthetic(seed = 1) }}
"""

CASES = {
    # name: (layer list, chunks, recompute, cuda_graphs)
    "gla-c4": ("[gla] * {n}", 4, "none", "false"),
    "gla-c8": ("[gla] * {n}", 8, "none", "false"),
    "gla-c16": ("[gla] * {n}", 16, "none", "false"),
    "gla-c8-mlp": ("[gla] * {n}", 8, "mlp", "false"),
    "gla-c8-full": ("[gla] * {n}", 8, "full", "false"),
    "gla-c8-step": ("[gla] * {n}", 8, "none", "step"),
    "gdn-c8": ("[gdn] * {n}", 8, "none", "false"),
    "hybrid-c8": ("[gla, gla, gla, attn] * {q}", 8, "none", "false"),
    "hybrid-c8-gqa": ("[gla, gla, gla, attn] * {q}", 8, "none", "false"),
    "gdn-c8-fla": ("[gdn] * {n}", 8, "none", "false"),
}
MODEL_KEYS = {
    # name: the attn layers' own heads (twice the model's query heads, each key/value head shared by two)
    "hybrid-c8-gqa": "attn_heads = {wide}  attn_kv_heads = {heads}  qkv_bias = true",
    # flash-linear-attention's Gated DeltaNet: grouped value heads (two per q/k head), short convolutions, Mamba-2 gates
    "gdn-c8-fla": "value_heads = {wide}  short_conv_size = 4  delta_gates = mamba",
}


def schedule_text(args: argparse.Namespace, case: str) -> str:
    layers, chunks, recompute, graphs = CASES[case]
    return SCHEDULE.format(
        vocab=args.vocab, d_model=args.d_model, layers=layers.format(n=args.layers, q=max(1, args.layers // 4)),
        heads=args.heads, head_dim=args.head_dim, length=args.length, chunks=chunks,
        microbatches=args.microbatches, graphs=graphs, recompute=recompute, steps=args.steps, dtype=args.dtype,
        extra_keys=MODEL_KEYS.get(case, "").format(wide=2 * args.heads, heads=args.heads),
    )


def measure(args: argparse.Namespace, case: str) -> dict:
    text = schedule_text(args, case)
    program = compile_schedule(ScheduleText(text), through=Pass.CHECK).program
    (predicted,) = predict_memory(program)
    device = torch.device("cuda")
    trainer = launch_single_stage(compile_schedule_text(text))
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
    add_stage_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the records to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark measures CUDA memory: it needs a GPU")
    single_rank_environment(29534)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, {args.layers} blocks d={args.d_model}, "
          f"{args.microbatches} x {args.length} tokens, {args.dtype}")
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
