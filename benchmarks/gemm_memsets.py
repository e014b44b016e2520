"""The GEMMs of one GLA block's chunk under CUDA-graph replay, per cuBLAS setting: time, kernels, memsets, gaps.

With a cuBLAS workspace nearly every GEMM kernel of a replayed chunk graph comes after a small memset, a graph
node of its own with a longer launch gap ahead of the next kernel ([Note: GEMMs without a workspace in CUDA
graphs]; the measurements are in docs/benchmarks.md, "Measurements behind the runtime"). This script replays
the linear layers of one chunk of a GLA block with its SwiGLU MLP (forward GEMMs, input-gradient GEMMs, and weight gradients added into ``.grad``
with ``addmm_``, as the runtime's CUDA-graph stages do), at the benchmark model's sizes, once per setting, each
in a fresh process because cuBLAS reads its environment once:

- ``default``: torch's choices;
- ``cublaslt``: ``TORCH_BLAS_PREFER_CUBLASLT=1``, torch's cuBLASLt path;
- ``no-workspace``: ``CUBLAS_WORKSPACE_CONFIG=:0:0`` and ``CUBLASLT_WORKSPACE_SIZE=0`` (KiB, read when torch
  creates its cuBLASLt handle): no workspace for either library, so no split-K or stream-K kernel that
  reduces through a zeroed workspace (what the memsets look like);
- ``cublaslt-no-workspace``: both of the above.

It prints, per setting: milliseconds per replay, kernels and memsets per replay, and the launch gaps that
hold a memset (``benchmarks/trace_gaps.py``'s measure). A setting is worth trying in the pipeline benchmark
when its replay is faster, not only when its memsets are gone.

    python3 benchmarks/gemm_memsets.py [--rows 8192] [--d-model 2048] [--replays 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = {
    "default": {},
    "cublaslt": {"TORCH_BLAS_PREFER_CUBLASLT": "1"},
    "no-workspace": {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"},
    "cublaslt-no-workspace": {
        "TORCH_BLAS_PREFER_CUBLASLT": "1",
        "CUBLAS_WORKSPACE_CONFIG": ":0:0",
        "CUBLASLT_WORKSPACE_SIZE": "0",
    },
}


def block_linears(d_model: int, mlp_width: int) -> list[tuple[int, int, bool]]:
    """(in, out, has a bias) of the linear layers of a GLA block with its SwiGLU MLP, as
    schedlang.runtime.model builds them: q, k, v, the forget gate (with a bias), o; gate-and-up, down."""
    mixer = [(d_model, d_model, False)] * 3 + [(d_model, d_model, True), (d_model, d_model, False)]
    return mixer + [(d_model, 2 * mlp_width, False), (mlp_width, d_model, False)]


def chunk_gemms(rows: int, d_model: int, mlp_width: int):
    """A function that runs every GEMM of one chunk's forward and backward through those layers."""
    import torch

    device, dtype = torch.device("cuda"), torch.bfloat16
    layers = []
    for fan_in, fan_out, has_bias in block_linears(d_model, mlp_width):
        weight = torch.randn(fan_out, fan_in, device=device, dtype=dtype) * fan_in**-0.5
        layers.append(
            (
                weight,
                torch.zeros(fan_out, device=device, dtype=dtype) if has_bias else None,
                torch.zeros_like(weight),  # .grad
                torch.randn(rows, fan_in, device=device, dtype=dtype),  # the saved input
                torch.randn(rows, fan_out, device=device, dtype=dtype),  # the output gradient
                torch.empty(rows, fan_out, device=device, dtype=dtype),
                torch.empty(rows, fan_in, device=device, dtype=dtype),
            )
        )

    def run() -> None:
        for weight, bias, grad, inputs, output_grad, output, input_grad in layers:
            if bias is None:
                torch.mm(inputs, weight.t(), out=output)
            else:
                torch.addmm(bias, inputs, weight.t(), out=output)  # F.linear's bias epilogue (cuBLASLt)
            torch.mm(output_grad, weight, out=input_grad)
            grad.addmm_(output_grad.t(), inputs)

    return run


def worker(args: argparse.Namespace) -> dict:
    import torch

    from benchmarks.trace_gaps import compute_intervals, load_events, memset_starts, step_gaps

    if not torch.cuda.is_available():
        raise SystemExit("gemm_memsets.py replays CUDA graphs: it needs a GPU")
    run = chunk_gemms(args.rows, args.d_model, args.mlp_width)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()  # cuBLAS picks and loads its kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.replays):
        graph.replay()
    end.record()
    end.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as directory:
        trace = Path(directory) / "replay.json"
        profiler.export_chrome_trace(str(trace))
        events = load_events(trace)
    intervals = compute_intervals(events)
    memsets = memset_starts(events)
    gaps = step_gaps(intervals, long_us=50.0, memsets=memsets)
    return {
        "replay_ms": start.elapsed_time(end) / args.replays,
        "kernels": len(intervals),
        "memsets": len(memsets),
        "gap_ms": gaps.short_gap_ms,
        "memset_gap_ms": gaps.memset_gap_ms,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192, help="tokens of one chunk (32K sequence, 4 chunks)")
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--mlp-width", type=int, default=5464, help="SwiGLU width (d_model * 8/3, aligned)")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--json", help="also write the results, one object per setting, to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    passed = [f"--rows={args.rows}", f"--d-model={args.d_model}", f"--mlp-width={args.mlp_width}"]
    print(f"GEMMs of one GLA block chunk ({args.rows} rows, d_model {args.d_model}, MLP {args.mlp_width}), "
          f"one CUDA graph, {args.replays} replays")
    print("| setting | ms per replay | kernels | memsets | launch gaps ms | of which hold a memset |")
    print("|---|---|---|---|---|---|")
    results = {}
    for name, env in SETTINGS.items():
        command = [sys.executable, __file__, "--worker", f"--replays={args.replays}", *passed]
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"| {name} | failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode} |")
            continue
        result = results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"| {name} | {result['replay_ms']:.3f} | {result['kernels']} | {result['memsets']} | "
            f"{result['gap_ms']:.3f} | {result['memset_gap_ms']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({name: {"env": SETTINGS[name], **result} for name, result in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
