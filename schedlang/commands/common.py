"""Pieces several subcommands share: loading a legal program, the cost-model options, writing output.

``load_legal_program`` prints an illegal schedule's report exactly as
``schedlang check`` does, so every command that refuses one says the same thing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def print_legality_report(path: str, program, report) -> None:
    """Every violation of ``report``, with carets into the schedule file, on standard error."""
    from schedlang.frontend import read_source
    from schedlang.lowering.legality import render_report

    text = read_source(path)
    print(render_report(report, {str(path): text, program.source_file: text}), file=sys.stderr)


def load_legal_program(path: str):
    """The checked program and its orders, or None after printing why the schedule is illegal."""
    from schedlang.frontend import load_program
    from schedlang.lowering.legality import check_orders
    from schedlang.lowering.orders import stage_orders

    program = load_program(path)
    report = check_orders(program)
    if not report.is_legal:
        print_legality_report(path, program, report)
        return None
    return program, stage_orders(program)


def add_cost_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cost-model`` and the flops model's hardware options."""
    parser.add_argument(
        "--cost-model",
        choices=("unit", "flops"),
        default="unit",
        help="unit: forward of s tokens costs s/T, backward 2s/T, free messages; "
        "flops: layer FLOPs over device throughput plus alpha-beta messages (docs/cost-model.md)",
    )
    parser.add_argument("--throughput", type=float, default=400e12, help="flops model: device FLOP/s")
    parser.add_argument("--latency", type=float, default=10e-6, help="flops model: message latency alpha, s")
    parser.add_argument("--bandwidth", type=float, default=50e9, help="flops model: link bandwidth beta, B/s")
    parser.add_argument(
        "--memory-bandwidth", type=float, default=3.5e12,
        help="flops model: device memory bandwidth, B/s (each backward adds its gradients into .grad at it)",
    )
    parser.add_argument(
        "--kernel-gap", type=float, default=0.0,
        help="flops model: idle seconds per kernel launch (about 1.2e-6 for CUDA-graph replay on an H200), "
        "what makes many small chunks cost more than their FLOPs",
    )


def check_hardware_arguments(args: argparse.Namespace, command: str) -> None:
    """Refuse non-positive throughput/bandwidth and negative latency before any work is done."""
    for name in ("throughput", "bandwidth", "memory_bandwidth"):
        if not getattr(args, name) > 0:
            flag = name.replace("_", "-")
            raise SystemExit(f"schedlang {command}: error: --{flag} must be positive, got {getattr(args, name)}")
    for name in ("latency", "kernel_gap"):
        if getattr(args, name) < 0:
            flag = name.replace("_", "-")
            raise SystemExit(f"schedlang {command}: error: --{flag} must not be negative, got {getattr(args, name)}")


def cost_model_from_arguments(args: argparse.Namespace, program):
    """The kind named by ``--cost-model`` and the cost model built with the hardware options."""
    from schedlang.lowering.cost import CostModelKind, Hardware, make_cost_model

    kind = CostModelKind(args.cost_model)
    hardware = Hardware(args.throughput, args.latency, args.bandwidth, args.memory_bandwidth, args.kernel_gap)
    return kind, make_cost_model(kind, program, hardware)


def write_output(output: str, content: str | bytes) -> None:
    if output == "-":
        if isinstance(content, bytes):
            raise SystemExit("schedlang: error: a PNG cannot be written to standard output; give -o FILE.png")
        sys.stdout.write(content)
        return
    if isinstance(content, bytes):
        Path(output).write_bytes(content)
    else:
        Path(output).write_text(content, encoding="utf-8")
