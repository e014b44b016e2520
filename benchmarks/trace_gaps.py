"""Where a pipeline stage's GPU idles in one profiled step: busy time, small launch gaps, and the long waits.

Reads the Chrome traces that ``benchmarks/pipeline.py --trace-dir`` writes (one per system and stage, plain
or gzipped JSON), merges the intervals of the compute kernels (every GPU kernel but NCCL's) and splits the
idle time of the step (first kernel start to last kernel end) into gaps shorter than ``--long-us`` (kernel
launch gaps, even inside CUDA-graph replays) and long ones (waits for the other stage, fill and drain), which
it lists with their offset into the step, so that a wait at the start (fill), in the middle or at the end
(drain) reads off directly. Memsets are not compute: a launch gap with one inside (cuBLAS zeroes a small
counter before most of its GEMM kernels, a node of its own in a CUDA graph, and every such node adds a gap) is
counted once more on its own, to say what those memsets cost.

    python3 benchmarks/trace_gaps.py traces/trace-schedlang-8g+2-stage*.json [--long-us 50] [--top 12]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepGaps:
    step_ms: float
    busy_ms: float
    kernels: int
    short_gap_ms: float
    short_gaps: int
    long_gaps: tuple[tuple[float, float], ...]  # (offset into the step, duration), ms
    memset_gap_ms: float = 0.0  # the part of short_gap_ms in gaps holding a memset
    memset_gaps: int = 0

    @property
    def long_gap_ms(self) -> float:
        return sum(duration for _, duration in self.long_gaps)


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        trace = json.load(handle)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def is_communication_kernel(name: str) -> bool:
    """Whether a GPU kernel is NCCL's (a collective or a point-to-point message), not compute."""
    return "nccl" in name.lower()


def compute_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every GPU kernel that is not a collective or point-to-point one."""
    return sorted(
        (float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0.0)))
        for event in events
        if event.get("cat") == "kernel" and not is_communication_kernel(event.get("name", ""))
    )


def memset_starts(events: list[dict]) -> list[float]:
    """Start times in microseconds of the GPU memsets, sorted."""
    return sorted(float(event["ts"]) for event in events if event.get("cat") == "gpu_memset")


def step_gaps(intervals: list[tuple[float, float]], long_us: float, memsets: list[float] = ()) -> StepGaps:
    """Merge overlapping kernels and classify the holes between them; ``memsets`` (sorted start times) mark the
    launch gaps that hold one."""
    if not intervals:
        return StepGaps(0.0, 0.0, 0, 0.0, 0, ())
    start = intervals[0][0]
    busy = short = with_memset = 0.0
    n_short = n_with_memset = 0
    long_gaps = []
    current_start, current_end = intervals[0]
    for begin, end in intervals[1:]:
        if begin <= current_end:
            current_end = max(current_end, end)
            continue
        busy += current_end - current_start
        gap = begin - current_end
        if gap < long_us:
            short += gap
            n_short += 1
            first_after = bisect.bisect_left(memsets, current_end)
            if first_after < len(memsets) and memsets[first_after] < begin:
                with_memset += gap
                n_with_memset += 1
        else:
            long_gaps.append(((current_end - start) / 1e3, gap / 1e3))
        current_start, current_end = begin, end
    busy += current_end - current_start
    return StepGaps(
        (current_end - start) / 1e3,
        busy / 1e3,
        len(intervals),
        short / 1e3,
        n_short,
        tuple(long_gaps),
        with_memset / 1e3,
        n_with_memset,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--long-us", type=float, default=50.0, help="gaps at least this long are waits (us)")
    parser.add_argument("--top", type=int, default=12, help="list this many of the longest waits per trace")
    args = parser.parse_args()
    print("| trace | step ms | busy ms | kernels | short gaps ms (count) | of which hold a memset | long waits ms (count) |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for path in args.traces:
        events = load_events(path)
        gaps = step_gaps(compute_intervals(events), args.long_us, memset_starts(events))
        results[path] = gaps
        print(
            f"| {path.name} | {gaps.step_ms:.1f} | {gaps.busy_ms:.1f} | {gaps.kernels} | "
            f"{gaps.short_gap_ms:.1f} ({gaps.short_gaps}) | {gaps.memset_gap_ms:.1f} ({gaps.memset_gaps}) | "
            f"{gaps.long_gap_ms:.1f} ({len(gaps.long_gaps)}) |"
        )
    for path, gaps in results.items():
        longest = sorted(gaps.long_gaps, key=lambda gap: -gap[1])[: args.top]
        waits = ", ".join(f"{duration:.1f} at {offset:.0f}" for offset, duration in sorted(longest))
        print(f"{path.name}: longest waits (ms at ms into the step): {waits}")


if __name__ == "__main__":
    main()
