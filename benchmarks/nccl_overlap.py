"""What resident NCCL kernels cost the compute kernels beside them, in one profiled step of a stage.

Reads the Chrome traces of ``benchmarks/pipeline.py --trace-dir`` (as ``benchmarks/trace_gaps.py`` does).
A point-to-point NCCL kernel is resident from the moment its stream reaches it until the peer's matching
kernel has run, and while it is there it holds streaming multiprocessors and polls memory. This tool splits
every compute kernel (every GPU kernel but NCCL's) by whether its run overlaps a resident NCCL kernel, and
for each kernel (name and grid) that ran both ways compares the mean durations: the **excess** is what the overlapped
runs took beyond the same kernel's mean run alone, summed over the step. It also says for how long NCCL
kernels were resident while the GPU computed (the overlap that can cost) and while it had nothing else to
run (the overlap that cannot).

    python3 benchmarks/nccl_overlap.py traces/trace-*-stage*.json [--top 8]
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trace_gaps import is_communication_kernel, load_events  # noqa: E402


@dataclass(frozen=True)
class KernelRun:
    name: str
    start: float  # microseconds
    end: float


@dataclass(frozen=True)
class OverlapCost:
    nccl_ms: float  # time with an NCCL kernel resident (union)
    nccl_beside_compute_ms: float  # of that, while a compute kernel ran
    overlapped_kernels: int  # compute kernel runs that overlapped an NCCL kernel
    compared_kernels: int  # of those, runs whose name also ran alone, so that they could be compared
    excess_ms: float  # their time beyond the same names' mean alone
    by_name: tuple[tuple[str, float, int], ...]  # (name, excess ms, overlapped runs), largest excess first


def kernel_runs(events: list[dict]) -> tuple[list[KernelRun], list[KernelRun]]:
    """(compute kernels, NCCL kernels) of a trace, each sorted by start."""
    compute, nccl = [], []
    for event in events:
        if event.get("cat") != "kernel":
            continue
        start = float(event["ts"])
        name = event.get("name", "")
        communication = is_communication_kernel(name)
        grid = (event.get("args") or {}).get("grid")
        if grid and not communication:
            name = f"{name} grid={tuple(grid)}"  # one kernel at different shapes is not one comparison
        run = KernelRun(name, start, start + float(event.get("dur", 0.0)))
        (nccl if communication else compute).append(run)
    return sorted(compute, key=lambda run: run.start), sorted(nccl, key=lambda run: run.start)


def merged(runs: list[KernelRun]) -> list[tuple[float, float]]:
    """The union of the runs' intervals, as sorted disjoint (start, end) pairs."""
    spans: list[list[float]] = []
    for run in sorted(runs, key=lambda run: run.start):
        if spans and run.start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], run.end)
        else:
            spans.append([run.start, run.end])
    return [(start, end) for start, end in spans]


def overlap_with(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Microseconds of [start, end) covered by the disjoint sorted ``spans``."""
    covered = 0.0
    index = max(bisect.bisect_right(spans, (start, float("inf"))) - 1, 0)
    while index < len(spans) and spans[index][0] < end:
        covered += max(0.0, min(end, spans[index][1]) - max(start, spans[index][0]))
        index += 1
    return covered


def overlap_cost(compute: list[KernelRun], nccl: list[KernelRun], top: int = 8) -> OverlapCost:
    """Compare each compute kernel name's runs beside an NCCL kernel with its runs alone (see the module doc)."""
    nccl_spans = merged(nccl)
    compute_spans = merged(compute)
    alone: dict[str, list[float]] = defaultdict(list)
    beside: dict[str, list[float]] = defaultdict(list)
    for run in compute:
        (beside if overlap_with(nccl_spans, run.start, run.end) > 0 else alone)[run.name].append(run.end - run.start)
    excess_by_name = []
    compared = 0
    for name, durations in beside.items():
        if not alone.get(name):
            continue
        mean_alone = sum(alone[name]) / len(alone[name])
        compared += len(durations)
        excess_by_name.append((name, sum(duration - mean_alone for duration in durations) / 1e3, len(durations)))
    excess_by_name.sort(key=lambda item: -item[1])
    return OverlapCost(
        nccl_ms=sum(end - start for start, end in nccl_spans) / 1e3,
        nccl_beside_compute_ms=sum(overlap_with(compute_spans, start, end) for start, end in nccl_spans) / 1e3,
        overlapped_kernels=sum(len(durations) for durations in beside.values()),
        compared_kernels=compared,
        excess_ms=sum(item[1] for item in excess_by_name),
        by_name=tuple(excess_by_name[:top]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=8, help="list this many kernel names by excess per trace")
    args = parser.parse_args()
    print("| trace | NCCL resident ms | of which beside compute ms | compute runs beside NCCL (compared) | excess ms |")
    print("|---|---|---|---|---|")
    costs = {}
    for path in args.traces:
        cost = overlap_cost(*kernel_runs(load_events(path)), top=args.top)
        costs[path] = cost
        print(
            f"| {path.name} | {cost.nccl_ms:.1f} | {cost.nccl_beside_compute_ms:.1f} | "
            f"{cost.overlapped_kernels} ({cost.compared_kernels}) | {cost.excess_ms:.1f} |"
        )
    for path, cost in costs.items():
        names = "; ".join(f"{name[:60]} {excess:+.2f} ms ({runs})" for name, excess, runs in cost.by_name)
        print(f"{path.name}: {names}")


if __name__ == "__main__":
    main()
