"""Registers, spills and shared memory of every Triton kernel chunk_gla / chunk_simple_gla / chunk_gated_delta_rule
launch, without a GPU.

    python benchmarks/kernel_resources.py                    # bf16, H=16, K=V=128 (the issue-3 shapes)
    python benchmarks/kernel_resources.py --dtype float32 --dim 64
    python benchmarks/kernel_resources.py --num-warps 8       # what-if: every kernel at 8 warps
    python benchmarks/kernel_resources.py --operators gdn     # Gated DeltaNet's kernels only
    python benchmarks/kernel_resources.py --launch-table t.json  # under launch-table overrides (tune_kernels.py --out)

Runs one forward+backward of each operator on CPU tensors with backend="triton" while every launch is a
compile for Hopper (sm_90) instead (``schedlang.kernels.compile_check.compile_only_launches``: no kernel runs; the
numbers the host code gets back are garbage and never used), and reads each cubin's resource usage with the
cuobjdump that ships inside Triton's package. A kernel at 255 registers, or with a nonzero stack, runs at most
one block of its warps per multiprocessor or spills: costs that device time would otherwise be spent finding.
Run it without TRITON_INTERPRET (the interpreter never reaches the launcher). Arguments are specialised as a
launch on the GPU specialises them (integers divisible by 16, pointer alignment).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.kernels import import_launch_tables  # noqa: E402
from schedlang.kernels import chunk_gated_delta_rule, chunk_gla, chunk_simple_gla  # noqa: E402
from schedlang.kernels.common.arguments import COMPILE_ONLY_VARIABLE  # noqa: E402
from schedlang.kernels.common.launch_tables import launch_overrides  # noqa: E402
from schedlang.kernels.compile_check import SHARED_LIMIT, CompiledLaunch, compile_only_launches  # noqa: E402

OPERATORS = ("gla", "simple_gla", "gdn")


def run_operator(operator: str, dim: int, heads: int, length: int, dtype: torch.dtype) -> None:
    """One forward+backward of ``operator`` on CPU tensors (each launch a compile under compile_only_launches)."""
    gate_shape = (1, length, heads, dim) if operator == "gla" else (1, length, heads)
    q, k, v = (torch.randn(1, length, heads, dim, dtype=dtype, requires_grad=True) for _ in range(3))
    g = F.logsigmoid(torch.randn(*gate_shape)).requires_grad_(True)
    state = torch.zeros(1, heads, dim, dim, requires_grad=True)
    if operator == "gdn":
        beta = torch.rand(1, length, heads, dtype=dtype, requires_grad=True)
        output, final_state = chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=state, output_final_state=True, backend="triton"
        )
    else:
        function = chunk_gla if operator == "gla" else chunk_simple_gla
        output, final_state = function(q, k, v, g, initial_state=state, output_final_state=True, backend="triton")
    (output.float().sum() + final_state.sum()).backward()


def resource_usage(launch: CompiledLaunch, workdir: str) -> str:
    path = os.path.join(workdir, launch.kernel_name + ".cubin")
    with open(path, "wb") as handle:
        handle.write(launch.compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    report = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True, check=True).stdout
    fields = next(line for line in report.splitlines() if "REG:" in line).split()
    usage = dict(field.split(":", 1) for field in fields if ":" in field)
    return f"{usage['REG']:>4} {usage['STACK']:>6} {launch.compiled.metadata.shared:>8}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--num-warps", type=int, help="compile every kernel with this many warps instead (what-if)")
    parser.add_argument("--num-stages", type=int, help="and with this many software-pipeline stages (what-if)")
    parser.add_argument("--only", help="only kernels whose name contains this text")
    parser.add_argument("--operators", nargs="+", choices=OPERATORS, default=list(OPERATORS))
    parser.add_argument("--launch-table", type=Path, help="launch-table overrides, {table: {entry: {knob: value}}}")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter never compiles", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    print(f"# sm_90, {args.dtype}, H={args.heads}, K=V={args.dim}; registers per thread, stack bytes, shared bytes")
    print(f"{'operator':10} {'kernel':36} {'warps':>5} {'stages':>6} {'regs':>4} {'stack':>6} {'shared':>8}")
    import_launch_tables()
    os.environ[COMPILE_ONLY_VARIABLE] = "1"  # CPU tensors take the Triton path, bfloat16 included
    forced = {name: value for name, value in (("num_warps", args.num_warps), ("num_stages", args.num_stages)) if value}
    launches: list[CompiledLaunch] = []
    # what-ifs may ask for more shared memory than a block has: report it rather than stop
    compile_only_launches(90, 2**31, launches.append, forced)
    overrides = json.loads(args.launch_table.read_text()) if args.launch_table else {}
    with tempfile.TemporaryDirectory() as workdir, launch_overrides(overrides):
        for operator in args.operators:
            launches.clear()
            run_operator(operator, args.dim, args.heads, 256, dtype)
            for launch in launches:
                if args.only and args.only not in launch.kernel_name:
                    continue
                usage = resource_usage(launch, workdir)
                over = "  over the block's shared memory" if launch.compiled.metadata.shared > SHARED_LIMIT else ""
                print(f"{operator:10} {launch.kernel_name:36} {launch.num_warps:>5} {launch.num_stages:>6} {usage}{over}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
