"""Pieces several subcommands share: compiling a legal schedule, the cost-model options, writing output.

``compile_legal`` runs :func:`schedlang.compiler.compile_schedule` (or its prefix) and prints an illegal
schedule's report exactly as ``schedlang check`` does, so every command that refuses one says the same
thing.
"""

from __future__ import annotations

import argparse
import sys


def print_legality_report(program, report) -> None:
    """Every violation of ``report``, with carets into the program's schedule text, on standard error."""
    from schedlang.lowering.legality import render_report

    print(render_report(report, {program.source_file: program.source_text}), file=sys.stderr)


def compile_legal(program, through, cost=None):
    """The rest of :func:`~schedlang.compiler.compile_schedule` for a checked program, up to ``through``,
    or None after printing why the schedule is illegal (or why the hardware profile cannot cost it)."""
    from schedlang.compiler import compile_schedule
    from schedlang.lowering.legality import IllegalScheduleError
    from schedlang.lowering.profile_cost import MissingMeasurementError

    try:
        return compile_schedule(program, through=through, cost=cost)
    except IllegalScheduleError as error:
        print_legality_report(program, error.report)
        return None
    except MissingMeasurementError as error:
        print(f"schedlang: error: {program.source_file}: {error}", file=sys.stderr)
        return None


def add_hardware_argument(parser: argparse.ArgumentParser) -> None:
    """``--hardware PATH|NAME``: a hardware profile file, or a profile shipped with schedlang (``h200``, ...).
    Read it with :func:`load_hardware_option`."""
    parser.add_argument(
        "--hardware", metavar="PATH|NAME", default=None,
        help="hardware profile: a file written by `schedlang profile`, or a shipped one (h200, zeco-h100, "
        "stateflow-a100): the profile cost model, its measured curves and links (docs/cost-model.md, 'profile')",
    )


def load_hardware_option(args: argparse.Namespace, command: str):
    """The :class:`~schedlang.lowering.hardware_profile.HardwareProfile` ``--hardware`` names (None without the
    option), read once and kept on ``args``; a profile that cannot be read is printed as its positioned error and
    exits with status 2."""
    from schedlang.lowering.hardware_profile import HardwareProfileError, resolve_hardware

    if getattr(args, "hardware", None) is None:
        return None
    cached = getattr(args, "hardware_profile", None)
    if cached is not None:
        return cached
    try:
        profile = resolve_hardware(args.hardware)
    except HardwareProfileError as error:
        print(f"schedlang {command}: " + error.render(), file=sys.stderr)
        raise SystemExit(2) from None
    args.hardware_profile = profile
    return profile


def add_cost_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cost-model``, ``--hardware`` and the flops model's hardware options."""
    parser.add_argument(
        "--cost-model",
        choices=("unit", "flops"),
        default=None,
        help="unit (the default): forward of s tokens costs s/T, backward 2s/T, free messages; "
        "flops: layer FLOPs over device throughput plus alpha-beta messages (docs/cost-model.md); "
        "--hardware instead gives the profile model",
    )
    add_hardware_argument(parser)
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
    """Refuse non-finite hardware numbers, non-positive throughput/bandwidth and negative latency or kernel gap
    before any work is done; read ``--hardware`` and refuse a ``--cost-model`` that contradicts it."""
    import math

    for name in ("throughput", "latency", "bandwidth", "memory_bandwidth", "kernel_gap"):
        if not math.isfinite(getattr(args, name)):
            flag = name.replace("_", "-")
            raise SystemExit(f"schedlang {command}: error: --{flag} must be a finite number, got {getattr(args, name)}")
    profile = load_hardware_option(args, command)
    if profile is not None and args.cost_model is not None:
        raise SystemExit(
            f"schedlang {command}: error: --hardware gives the profile cost model; drop --cost-model {args.cost_model}"
        )
    for name in ("throughput", "bandwidth", "memory_bandwidth"):
        if not getattr(args, name) > 0:
            flag = name.replace("_", "-")
            raise SystemExit(f"schedlang {command}: error: --{flag} must be positive, got {getattr(args, name)}")
    for name in ("latency", "kernel_gap"):
        if getattr(args, name) < 0:
            flag = name.replace("_", "-")
            raise SystemExit(f"schedlang {command}: error: --{flag} must not be negative, got {getattr(args, name)}")


def cost_settings_from_arguments(args: argparse.Namespace):
    """The cost model named by ``--cost-model`` (or implied by ``--hardware``), with the hardware options or the
    profile, for the cost pass."""
    from schedlang.compiler import CostSettings
    from schedlang.lowering.cost import CostModelKind, Hardware

    profile = load_hardware_option(args, "simulate")
    if profile is not None:
        return CostSettings(CostModelKind.FLOPS, profile)  # a profile as the hardware: the profile model
    hardware = Hardware(args.throughput, args.latency, args.bandwidth, args.memory_bandwidth, args.kernel_gap)
    return CostSettings(CostModelKind(args.cost_model or "unit"), hardware)


def write_output(output: str, content: str | bytes) -> None:
    if output == "-":
        if isinstance(content, bytes):
            raise SystemExit("schedlang: error: a PNG cannot be written to standard output; give -o FILE.png")
        sys.stdout.write(content)
        return
    from schedlang.outputs import write_output_file

    write_output_file(output, content)
