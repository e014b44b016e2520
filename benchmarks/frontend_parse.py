"""Time loading schedule files with explicit orders, from tiny to 64 x 64 x 32.

For each size, builds a schedule whose `stage r:` lines list every task of a
1F1B-like order (all forwards, then backwards last chunk first), and times
``load_program_text`` (parse + semantic checks) against a peer doing the least
work that reads the same orders: splitting each line into words and calling
``TaskId.parse`` on each. Prints one line per size.

    python benchmarks/frontend_parse.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline_schedule import scale_text  # noqa: E402
from schedlang.frontend import load_program_text  # noqa: E402
from schedlang.vocabulary.actions import TaskId  # noqa: E402

SIZES = [(2, 4, 2), (8, 16, 8), (32, 32, 16), (64, 64, 32)]


def schedule_text(n_stages: int, n_microbatches: int, n_chunks: int) -> str:
    """benchmarks/schedules/gla_tiny_64_stages.sched at this size, every stage running all forwards, then all
    backwards, written out task by task."""
    order = [f"F{m}.{c}" for m in range(n_microbatches) for c in range(n_chunks)]
    order += [f"B{m}.{c}" for m in range(n_microbatches) for c in reversed(range(n_chunks))]
    return scale_text(n_stages, n_microbatches, n_chunks, [" ".join(order)] * n_stages)


def peer(text: str) -> int:
    count = 0
    for line in text.split("\n"):
        words = line.split()
        if words[:1] == ["stage"]:
            stage = int(words[1].rstrip(":"))
            for word in words[2:]:
                TaskId.parse(f"{stage}{word}")
                count += 1
    return count


def best_of(repeat: int, function, *arguments) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function(*arguments)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()} python {platform.python_version()}")
    print("stages microbatches chunks tasks  load_program_text_s  peer_split_parse_s  ratio")
    for n_stages, n_microbatches, n_chunks in SIZES:
        text = schedule_text(n_stages, n_microbatches, n_chunks)
        program = load_program_text(text, "bench.sched")
        n_tasks = sum(len(order.tasks) for order in program.pipeline.explicit_orders)
        assert n_tasks == peer(text) == 2 * n_stages * n_microbatches * n_chunks
        ours = best_of(args.repeat, load_program_text, text, "bench.sched")
        theirs = best_of(args.repeat, peer, text)
        print(
            f"{n_stages:6d} {n_microbatches:12d} {n_chunks:6d} {n_tasks:6d}"
            f"  {ours:19.3f}  {theirs:18.3f}  {ours / theirs:5.2f}"
        )


if __name__ == "__main__":
    main()
