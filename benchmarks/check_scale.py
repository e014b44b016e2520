"""How fast is ``schedlang check`` on a 64-stage x 64-microbatch x 32-chunk 1F1B schedule?

Measures, each in a fresh subprocess so peak RSS belongs to that measurement
alone:

* ``schedlang check`` as the command runs it (front end on a generated
  schedule file, 1F1B order generation, legality including the deadlock
  check): wall time and peak RSS, plus the RSS of a bare interpreter with the
  same imports, so the check's own footprint is the difference;
* the same for the schedule written with explicit ``stage r:`` lines (every
  task token parsed and its span kept), at the full size only;
* the in-memory path (``one_f_one_b_orders`` + ``check_orders``): wall time,
  and in a second run the tracemalloc peak of the Python objects it allocates;
* the peer: torch.distributed.pipelining's ``_add_send_recv`` and
  ``_simulate_comms_compute`` on the same 1F1B order written as torch actions
  (one torch microbatch per (microbatch, chunk) unit: 64 stages x 2048
  microbatches), with a time limit, at the full size and at smaller sizes to
  show the scaling.

Usage: ``python benchmarks/check_scale.py [--torch-limit SECONDS]``. Prints a
table; results are recorded in docs/benchmarks.md, "Legality check at 64 stages x 64 microbatches x 32
chunks".
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = [(8, 8, 4), (16, 16, 8), (32, 32, 16), (64, 64, 32)]
FULL_SIZE = (64, 64, 32)

def _peak_rss_mib() -> float:
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


def child_command_check(path: str) -> dict:
    import time

    import schedlang.commands.check as check  # noqa: F401  (imports counted in the baseline too)
    from schedlang.frontend import load_program
    from schedlang.lowering.legality import check_orders

    start = time.perf_counter()
    program = load_program(path)
    report = check_orders(program)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "legal": report.is_legal, "summary": report.summary(), "rss_mib": _peak_rss_mib()}


def child_baseline() -> dict:
    import schedlang.commands.check  # noqa: F401
    import schedlang.frontend  # noqa: F401
    import schedlang.lowering.legality  # noqa: F401

    return {"rss_mib": _peak_rss_mib()}


def child_in_memory(n_stages: int, n_microbatches: int, n_chunks: int, traced: int = 0) -> dict:
    """Order generation + legality; with ``traced`` under tracemalloc (which slows Python several-fold)."""
    import time
    import tracemalloc

    from schedlang.lowering.legality import check_orders
    from schedlang.lowering.orders import one_f_one_b_orders

    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    orders = one_f_one_b_orders(n_stages, n_microbatches, n_chunks)
    generated = time.perf_counter()
    report = check_orders((n_stages, n_microbatches, n_chunks), orders)
    elapsed = time.perf_counter() - start
    result = {
        "seconds": elapsed,
        "generate_seconds": generated - start,
        "legal": report.is_legal,
        "rss_mib": _peak_rss_mib(),
    }
    if traced:
        result["traced_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return result


def child_torch(n_stages: int, n_microbatches: int, n_chunks: int) -> dict:
    import time

    from torch.distributed.pipelining.schedules import (
        _Action,
        _add_send_recv,
        _ComputationType,
        _simulate_comms_compute,
    )

    from schedlang.lowering.orders import one_f_one_b_orders
    from schedlang.vocabulary.actions import ActionKind

    # one torch microbatch per (microbatch, chunk) unit; torch cannot express the chunk-to-chunk state edges
    compute = {
        stage: [
            _Action(
                stage,
                _ComputationType.FORWARD if task.kind is ActionKind.FORWARD else _ComputationType.FULL_BACKWARD,
                task.microbatch * n_chunks + task.chunk,
            )
            for task in order
        ]
        for stage, order in enumerate(one_f_one_b_orders(n_stages, n_microbatches, n_chunks))
    }
    start = time.perf_counter()
    with_comms = _add_send_recv(compute, stage_to_rank=lambda stage: stage, num_stages=n_stages)
    added = time.perf_counter()
    simulated = _simulate_comms_compute(with_comms, stage_to_rank=lambda stage: stage, num_stages=n_stages)
    done = time.perf_counter()
    return {
        "add_send_recv_seconds": added - start,
        "simulate_seconds": done - added,
        "steps": max(len(actions) for actions in simulated.values()),
        "rss_mib": _peak_rss_mib(),
    }


def run_child(arguments: list[str], timeout: float | None = None) -> dict:
    """Run this script as a child doing one measurement; returns its JSON or the reason it has none."""
    try:
        completed = subprocess.run(
            [sys.executable, __file__, "--child", *arguments],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if completed.returncode != 0:
        return {"error": completed.stderr.strip().splitlines()[-1] if completed.stderr.strip() else "failed"}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def write_schedule(directory: Path, n_stages: int, n_microbatches: int, n_chunks: int) -> str:
    """benchmarks/schedules/gla_tiny_64_stages.sched at this size, written into ``directory``."""
    from benchmarks.pipeline_schedule import scale_text

    path = directory / f"check_scale_{n_stages}x{n_microbatches}x{n_chunks}.sched"
    path.write_text(scale_text(n_stages, n_microbatches, n_chunks))
    return str(path)


def write_explicit_schedule(directory: Path, n_stages: int, n_microbatches: int, n_chunks: int) -> str:
    """The same 1F1B schedule with every task written out in ``stage r:`` lines (spans kept per task)."""
    from benchmarks.pipeline_schedule import scale_text
    from schedlang.lowering.orders import one_f_one_b_orders

    orders = one_f_one_b_orders(n_stages, n_microbatches, n_chunks)
    stage_orders = [" ".join(task.local_form() for task in order) for order in orders]
    text = scale_text(n_stages, n_microbatches, n_chunks, stage_orders)
    path = directory / f"check_scale_explicit_{n_stages}x{n_microbatches}x{n_chunks}.sched"
    path.write_text(text)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-limit", type=float, default=600.0, help="seconds allowed to each torch run")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "command":
            result = child_command_check(rest[0])
        elif kind == "baseline":
            result = child_baseline()
        elif kind == "memory":
            result = child_in_memory(*map(int, rest))
        else:
            result = child_torch(*map(int, rest))
        print(json.dumps(result))
        return

    print(f"python {platform.python_version()}, {platform.machine()}, {platform.processor() or 'cpu'}")
    baseline = run_child(["baseline"])
    print(f"interpreter + imports peak RSS: {baseline['rss_mib']:.0f} MiB")
    header = (
        f"{'size PxMxN':>12} {'tasks':>8} | {'check cmd s':>11} {'RSS MiB':>8} | {'in-mem s':>8} {'traced MiB':>10}"
        f" | {'torch add_send_recv s':>21} {'torch simulate s':>16} {'steps':>6}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as directory:
        for size in SIZES:
            n_stages, n_microbatches, n_chunks = size
            command = run_child(["command", write_schedule(Path(directory), *size)])
            memory = run_child(["memory", *map(str, size)])
            traced = run_child(["memory", *map(str, size), "1"])
            peer = run_child(["torch", *map(str, size)], timeout=args.torch_limit)
            if "timeout" in peer:
                torch_text = f"{'> ' + str(int(args.torch_limit)) + ' (limit)':>21} {'-':>16} {'-':>6}"
            elif "error" in peer:
                torch_text = f"error: {peer['error']}"
            else:
                torch_text = (
                    f"{peer['add_send_recv_seconds']:>21.2f} {peer['simulate_seconds']:>16.2f} {peer['steps']:>6}"
                )
            command_text = (
                f"{command['seconds']:>11.2f} {command['rss_mib']:>8.0f}"
                if "seconds" in command
                else f"{'error':>11} {'-':>8}"
            )
            print(
                f"{'x'.join(map(str, size)):>12} {2 * n_stages * n_microbatches * n_chunks:>8} | {command_text} | "
                f"{memory['seconds']:>8.2f} {traced['traced_peak_mib']:>10.0f} | {torch_text}",
                flush=True,
            )
            if "error" in command:
                print(f"  check command failed: {command['error']}")
            elif not command["legal"]:
                print(f"  check command found the schedule illegal: {command['summary']}")
        explicit = run_child(["command", write_explicit_schedule(Path(directory), *FULL_SIZE)])
        if "seconds" in explicit:
            print(
                f"explicit orders, every task written out, {'x'.join(map(str, FULL_SIZE))}: check command "
                f"{explicit['seconds']:.2f} s, peak RSS {explicit['rss_mib']:.0f} MiB, {explicit['summary']}"
            )
        else:
            print(f"explicit orders: check command failed: {explicit}")


if __name__ == "__main__":
    main()
