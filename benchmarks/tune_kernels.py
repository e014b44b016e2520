"""Sweep the Triton kernels' launch tables on this GPU and report the fastest exact configuration.

    python benchmarks/tune_kernels.py                       # GLA and simple GLA at B=1, T=16K, H=16, D=128, bf16
    python benchmarks/tune_kernels.py --budget 240 --out tuned.json
    python benchmarks/tune_kernels.py --length 4096 --state --graph   # chunk-sized calls, replayed from a CUDA graph
    python benchmarks/tune_kernels.py --entries scan        # one table entry (here the state scan's) alone
    python benchmarks/tune_kernels.py --operators gdn --length 32768   # the gated delta rule's state pass
    python benchmarks/kernels.py --launch-table tuned.json  # time (and compare with fla) under the tuned table

The tables are the registered launch tables (kernels/common/launch_tables.py): "gla" (kernels/gla/chunk_triton.py
LAUNCH), "simple_gla" (kernels/simple_gla/chunk_triton.py LAUNCH), "scan" (kernels/common/triton_scan.py
SCAN_LAUNCH) and "gdn" (kernels/gdn/state_pass_triton.py LAUNCH): tile edges, key splits, num_warps and num_stages
per kernel. Every candidate runs under ``launch_overrides``; no table is edited. At the end the tuner prints the
overrides it kept (and writes them with --out, the layout ``launch_overrides`` and kernels.py --launch-table take)
and each changed table as it would be written in its module, for a person to paste there.
Coordinate descent, one pass: for each entry and each knob, every candidate value is timed as the operator's
whole forward+backward (median of triton.testing.do_bench) and kept when it is at least 1% faster. A candidate
must also reproduce the output and every gradient of the starting table within 2% relative (bfloat16
accumulation order changes the last bits; a miscompiled kernel is far off), else it is rejected: a Hopper
miscompile found here is printed, never kept. Launch failures (shared memory, registers) are printed and
skipped. With --budget the sweep stops at that many seconds and keeps what it found. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

from schedlang.kernels import chunk_gated_delta_rule, chunk_gla, chunk_simple_gla
from schedlang.kernels.common.launch_tables import LAUNCH_TABLES, launch_overrides, table_source

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import capture_graph  # noqa: E402
from benchmarks.kernels import gradient_step, import_launch_tables, make_inputs  # noqa: E402

import_launch_tables()

TOLERANCE = 2e-2
KEEP_IF_FASTER = 0.99

# knob -> candidate values, per table entry
TILE_AND_LAUNCH = dict(block_k=[32, 64, 128], block_v=[32, 64, 128], num_warps=[4, 8], num_stages=[1, 2, 3, 4])
CANDIDATES = {
    "gla": {
        "updates": TILE_AND_LAUNCH,
        "updates_with_gradients": dict(TILE_AND_LAUNCH, block_k=[16, 32, 64]),
        "smooth_output": TILE_AND_LAUNCH,
        "smooth_dv": TILE_AND_LAUNCH,
        "smooth_dqkg": dict(TILE_AND_LAUNCH, block_k=[16, 32, 64], key_splits=[1, 2, 4]),
        "scan": dict(block_k=[8, 16, 32], block_v=[16, 32, 64], prefetch=[0, 1], num_warps=[1, 2, 4], num_stages=[2, 3, 4]),
    },
    "simple_gla": {
        "walk": dict(TILE_AND_LAUNCH, min_block=[16, 32, 64]),
        "output": TILE_AND_LAUNCH,
        "dv": TILE_AND_LAUNCH,
        "dqkg": dict(block_v=[16, 32, 64], num_warps=[4, 8], num_stages=[1, 2, 3]),
    },
    # no 8 warps: the backward miscompiled with them on an H200 ([Note: launch tables])
    "gdn": {
        **{
            entry: dict(block_v=[16, 32, 64], precision=["ieee", "tf32x3"], num_warps=[2, 4], num_stages=[1, 2, 3])
            for entry in ("forward", "backward")
        },
        # the per-chunk kernels: each candidate is checked against the starting table, so a miscompile at 8 warps
        # is rejected there
        **{
            entry: dict(block_k=[32, 64], block_v=[32, 64], num_warps=[4, 8], num_stages=[1, 2, 3])
            for entry in ("chunk_gradients", "output_gradients", "wy_apply", "output")
        },
    },
}
OPERATORS = {
    "gla": (chunk_gla, "gla"),
    "simple_gla": (chunk_simple_gla, "simple_gla"),
    "gdn": (chunk_gated_delta_rule, "gdn"),
}
"""operator -> (the function timed, the name of its launch table)."""

Overrides = dict[str, dict[str, dict[str, object]]]
"""table -> entry -> knob -> value, as ``launch_overrides`` takes them."""


def table_entry(operator: str, entry: str) -> tuple[str, str]:
    """The (table, entry) a CANDIDATES entry of ``operator`` names: "scan" is the state scan's shared table."""
    return ("scan", "scan") if entry == "scan" else (OPERATORS[operator][1], entry)


def relative_difference(results, reference) -> float:
    return max(
        ((result.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-30)).item()
        for result, expected in zip(results, reference)
    )


def measure(step, graph: bool = False) -> tuple[float, list[torch.Tensor]]:
    """(median ms of one forward+backward, its gradients); with graph, of the step captured in a CUDA graph and
    replayed (issue 5's chunk-sized calls), captured afresh since the table may have changed."""
    if not graph:
        results = [tensor.clone() for tensor in step()]
        return triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"), results
    captured_graph, captured = capture_graph(step)
    results = [tensor.clone() for tensor in captured]
    return triton.testing.do_bench(captured_graph.replay, warmup=25, rep=100, return_mode="median"), results


def sweep(operator: str, measure_step, deadline: float, log, entries=None, tuned: Overrides | None = None):
    """Coordinate descent over CANDIDATES[operator] (only ``entries`` of it, if given); returns (start, end) ms.

    ``tuned`` holds the overrides kept so far (from earlier operators too: they share the scan table); the sweep
    starts from them and adds what it keeps. ``measure_step()`` times the operator under the active overrides:
    (ms, output and gradients). A candidate is kept only if it is at least 1% faster than the best so far and its
    results are within TOLERANCE of the starting table's; a candidate that raises is skipped."""
    tuned = {} if tuned is None else tuned
    with launch_overrides(tuned):
        start_ms, reference = measure_step()
    best_ms = start_ms
    log({"operator": operator, "start_ms": start_ms})
    for entry, knobs in CANDIDATES[operator].items():
        if entries and entry not in entries:
            continue
        table_name, entry_name = table_entry(operator, entry)
        for knob, values in knobs.items():
            for value in values:
                with launch_overrides(tuned):
                    current = LAUNCH_TABLES[table_name][entry_name]
                if knob not in current or time.monotonic() > deadline or value == current[knob]:
                    continue
                record = {"operator": operator, "entry": entry, knob: value}
                try:
                    with launch_overrides(tuned), launch_overrides({table_name: {entry_name: {knob: value}}}):
                        milliseconds, results = measure_step()
                    difference = relative_difference(results, reference)
                    record.update(ms=round(milliseconds, 4), rel_diff=difference)
                except Exception as error:  # a launch that does not fit is a result, not a reason to stop
                    record["error"] = repr(error)[:200]
                    milliseconds, difference = float("inf"), 0.0
                if difference > TOLERANCE:
                    record["rejected"] = "differs from the starting table: miscompiled or broken"
                if milliseconds < best_ms * KEEP_IF_FASTER and difference <= TOLERANCE:
                    best_ms = milliseconds
                    record["kept"] = True
                    tuned.setdefault(table_name, {}).setdefault(entry_name, {})[knob] = value
                log(record)
    return start_ms, best_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--operators", nargs="+", default=["gla", "simple_gla"], choices=sorted(OPERATORS))
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--state", action="store_true", help="calls with an initial state in and the final state out")
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays of the step (issue 5)")
    parser.add_argument("--budget", type=float, default=1e9, help="seconds for the whole sweep")
    parser.add_argument("--out", help="write the kept overrides (kernels.py --launch-table reads them)")
    parser.add_argument("--entries", nargs="+", help="sweep only these table entries (e.g. scan)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/tune_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.budget
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}", flush=True)

    def log(record):
        print(json.dumps(record), flush=True)

    summary, tuned = {}, {}
    for operator in args.operators:
        inputs = make_inputs(operator, args.length, args.heads, args.dim, with_state=args.state)
        step = gradient_step(OPERATORS[operator][0], inputs, with_state=args.state)
        summary[operator] = sweep(operator, lambda: measure(step, args.graph), deadline, log, args.entries, tuned)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(tuned, handle, indent=1)
    print(json.dumps(tuned))
    with launch_overrides(tuned):
        for name in tuned:
            print(table_source(LAUNCH_TABLES[name]))
    mode = ("state in/out, " if args.state else "") + ("graph replay" if args.graph else "eager")
    print(f"| op | T | fwd+bwd ({mode}), starting table (ms) | tuned (ms) | ratio |")
    print("|---|---|---|---|---|")
    for operator, (start_ms, best_ms) in summary.items():
        print(f"| {operator} | {args.length} | {start_ms:.3f} | {best_ms:.3f} | {best_ms / start_ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
