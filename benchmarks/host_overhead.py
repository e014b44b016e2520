"""Where the host's time goes when a chunk-sized operator call runs eagerly (issues 4 and 5).

A chunk call is short on the GPU, so eagerly its cost is the host's: argument checks, autograd, output
allocations and the Triton launches. This script times, for gla and simple_gla with a state in and out (B=1,
H=16, D=128, bf16):

- host_ms: wall time per forward+backward with the GPU never waited for inside the loop (the host issues
  ``--calls`` steps, then synchronises once), against
- gpu_ms: the same step replayed from a CUDA graph (the GPU's own time, no host work), and
- launch_us: the host cost of one launch of a trivial Triton kernel with as many arguments as ours,
  the floor that any Triton launch pays;

then the functions where the eager host time goes (cProfile, by own time).

    python benchmarks/host_overhead.py [--length 4096] [--calls 200] [--top 20]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import capture_graph  # noqa: E402
from benchmarks.kernels import gradient_step, make_inputs  # noqa: E402


@triton.jit
def _empty_kernel(a, b, c, d, e, f, g, h, i, j, k, l, m, n, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    pass


def launch_cost_us(calls: int) -> float:
    """Host microseconds per launch of a kernel that does nothing, with 16 arguments and 3 constexprs."""
    tensors = [torch.empty(16, device="cuda") for _ in range(14)]

    def launch():
        _empty_kernel[(64, 16)](*tensors, 4096, 64, H=16, K=128, V=128)

    return host_time_ms(launch, calls) * 1e3


def host_time_ms(step, calls: int) -> float:
    """Wall milliseconds per step while the host runs ahead of the GPU (one synchronisation at the end)."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        step()
    issued = time.perf_counter() - started
    torch.cuda.synchronize()
    return issued / calls * 1e3


def replay_ms(step) -> float:
    graph, _ = capture_graph(step)
    return triton.testing.do_bench(graph.replay, warmup=20, rep=100, return_mode="median")


def profile_top(step, calls: int, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> int:
    from schedlang.kernels import chunk_gla, chunk_simple_gla

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/host_overhead.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for name, operator in (("gla", chunk_gla), ("simple_gla", chunk_simple_gla)):
        step = gradient_step(operator, make_inputs(name, args.length, 16, 128, with_state=True), with_state=True)
        host = host_time_ms(step, args.calls)
        gpu = replay_ms(step)
        rows.append((name, host, gpu))
        print(f"# {name} T={args.length}: cProfile of {args.calls} eager forward+backward calls, by own time")
        print(profile_top(step, args.calls, args.top))
    launch = launch_cost_us(args.calls * 10)
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"trivial Triton launch (16 arguments, 3 constexprs): {launch:.1f} us of host time")
    print("| op | T | eager host ms per fwd+bwd | graph replay ms (GPU) | host / GPU |")
    print("|---|---|---|---|---|")
    for name, host, gpu in rows:
        print(f"| {name} | {args.length} | {host:.3f} | {gpu:.3f} | {host / gpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
