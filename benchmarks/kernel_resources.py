"""Registers, spills and shared memory of every Triton kernel chunk_gla / chunk_simple_gla / chunk_gated_delta_rule
launch, without a GPU.

    python benchmarks/kernel_resources.py                    # bf16, H=16, K=V=128 (the issue-3 shapes)
    python benchmarks/kernel_resources.py --dtype float32 --dim 64
    python benchmarks/kernel_resources.py --num-warps 8       # what-if: every kernel at 8 warps
    python benchmarks/kernel_resources.py --operators gdn     # Gated DeltaNet's kernels only
    python benchmarks/kernel_resources.py --launch-table t.json  # under launch-table overrides (tune_kernels.py --out)

Runs one forward+backward of each operator on CPU tensors with backend="triton" while Triton's launcher is
replaced by a recorder (no kernel runs; the numbers the host code gets back are garbage and never used),
then compiles each recorded launch for Hopper (sm_90) on this machine and reads the cubin's resource usage
with the cuobjdump that ships inside Triton's package. A kernel at 255 registers, or with a nonzero stack,
runs at most one block of its warps per multiprocessor or spills: costs that device time would otherwise
be spent finding. Run it without TRITON_INTERPRET (the interpreter never reaches the launcher).
Integer arguments are compiled unspecialised (Triton specialises those divisible by 16 at run time), so the
counts can differ by a few registers from the ones on the GPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.kernels import import_launch_tables  # noqa: E402
from schedlang.kernels import chunk_gated_delta_rule, chunk_gla, chunk_simple_gla  # noqa: E402
from schedlang.kernels.common import Backend  # noqa: E402
from schedlang.kernels.common.launch_tables import launch_overrides  # noqa: E402

OPERATORS = ("gla", "simple_gla", "gdn")

TRITON_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64"}


def record_launches(operator: str, dim: int, heads: int, length: int, dtype: torch.dtype) -> list[tuple]:
    """(kernel, signature, constexprs, options) of every launch in one forward+backward."""
    launches = []

    def recorder(self, *args, grid, warmup, **kwargs):
        options = {name: kwargs.pop(name) for name in ("num_warps", "num_stages") if name in kwargs}
        bound = dict(zip(self.arg_names, args))
        bound.update(kwargs)
        signature, constexprs = {}, {}
        for param in self.params:
            value = bound.get(param.name, param.default)
            if param.is_constexpr:
                signature[param.name] = "constexpr"
                constexprs[param.name] = value
            elif isinstance(value, torch.Tensor):
                signature[param.name] = TRITON_TYPES[value.dtype]
            elif isinstance(value, bool):
                signature[param.name] = "i1"
            elif isinstance(value, int):
                signature[param.name] = "i32"
            else:
                signature[param.name] = "fp32"
        launches.append((self, signature, constexprs, options))

    original = JITFunction.run
    JITFunction.run = recorder
    # the operators refuse bfloat16 on CPU tensors (the interpreter's tl.dot); nothing runs here, so let them through
    # gla and simple_gla choose their backend in the shared glue (kernels/common/chunk_operator.py), gdn in its own
    modules = [importlib.import_module(f"schedlang.kernels.{name}.chunk") for name in OPERATORS]
    modules.append(importlib.import_module("schedlang.kernels.common.chunk_operator"))
    dispatchers = [module for module in modules if hasattr(module, "resolve_backend")]
    refusing = [module.resolve_backend for module in dispatchers]
    for module in dispatchers:
        module.resolve_backend = lambda *args, **kwargs: Backend.TRITON
    try:
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
    finally:
        JITFunction.run = original
        for module, resolve in zip(dispatchers, refusing):
            module.resolve_backend = resolve
    return launches


def resource_usage(kernel, signature, constexprs, options, workdir: str) -> str:
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )
    path = os.path.join(workdir, kernel.__name__ + ".cubin")
    with open(path, "wb") as handle:
        handle.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    report = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True, check=True).stdout
    fields = next(line for line in report.splitlines() if "REG:" in line).split()
    usage = dict(field.split(":", 1) for field in fields if ":" in field)
    return f"{usage['REG']:>4} {usage['STACK']:>6} {compiled.metadata.shared:>8}"


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
    overrides = json.loads(args.launch_table.read_text()) if args.launch_table else {}
    with tempfile.TemporaryDirectory() as workdir, launch_overrides(overrides):
        for operator in args.operators:
            seen = set()
            for kernel, signature, constexprs, options in record_launches(operator, args.dim, args.heads, 256, dtype):
                key = (kernel.__name__, tuple(sorted(constexprs.items())))
                if key in seen:
                    continue
                seen.add(key)
                if args.only and args.only not in kernel.__name__:
                    continue
                if args.num_warps:
                    options = dict(options, num_warps=args.num_warps)
                if args.num_stages:
                    options = dict(options, num_stages=args.num_stages)
                usage = resource_usage(kernel, signature, constexprs, options, workdir)
                print(f"{operator:10} {kernel.__name__:36} {options.get('num_warps', 4):>5} {options.get('num_stages', 3):>6} {usage}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
