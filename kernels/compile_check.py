"""Compile every Triton kernel of the operators for a GPU, on a machine without one.

    python -m schedlang.kernels.compile_check              # sm_90 (H100, H200), bfloat16 and float32
    python -m schedlang.kernels.compile_check --arch 80 --dtypes bfloat16

Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) runs a kernel's Python, so it never meets what only
the compiler does: a jit helper's default argument that is not a constexpr, a shape the layouts reject, a tile
whose shared memory exceeds the device's. Here each operator's forward and backward run on CPU tensors with
Triton's active driver replaced by one that names a CUDA target of ``--arch``, and every launch replaced by a
compile (Triton's ``warmup``): the kernel goes through Triton's whole toolchain to a cubin (ptxas included) and
is never run, so the host code carries on with uninitialised tensors. Shapes reach every kernel and
specialisation the operators launch: head widths 64 and 128, keys and values of different widths, the
save-states and span-phase (sequence-parallel) entry points, 16-bit and float32 inputs.

One line per compiled kernel (name, shared memory); a kernel that fails to compile, or asks for more shared
memory than ``--shared-limit`` bytes (an H200 block's 227 KiB by default), ends the run with exit status 1 and
its name and error. Runs in a process of its own: it must import the kernels with TRITON_INTERPRET unset (the
interpreter replaces them at import) and sets SCHEDLANG_KERNELS_COMPILE_ONLY=1 (kernels/common/arguments.py) so
CPU tensors take the Triton path. Correctness stays with the GPU tests; this only proves the kernels build.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SHARED_LIMIT = 232448
"""Bytes of shared memory one block may use on sm_90 (227 KiB, the H100's and H200's opt-in maximum)."""


class CompileFailure(RuntimeError):
    """A kernel did not build, or would not launch, for the target."""


def _fake_cuda_driver(arch: int):
    """An object that answers what Triton's launch path asks of the active driver, for a CUDA target."""
    import torch
    from triton.backends.compiler import GPUTarget

    class CompileOnlyDriver:
        def is_active(self) -> bool:
            return True

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            pass

        def get_current_stream(self, device=None) -> int:
            return 0

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", arch, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_device_interface(self):
            return torch.cuda

        def get_benchmarker(self):
            raise CompileFailure("the compile check runs no kernel, so it benchmarks none")

    return CompileOnlyDriver()


@dataclass(frozen=True)
class CompiledLaunch:
    """One kernel specialisation as a launch compiled it: the kernel's name, Triton's compiled kernel (its
    ``asm["cubin"]``, ``metadata.shared``) and the launch options it was compiled with."""

    kernel_name: str
    compiled: Any
    num_warps: int
    num_stages: int


def compile_only_launches(
    arch: int,
    shared_limit: int,
    on_compile: Callable[[CompiledLaunch], None],
    forced_options: dict[str, int] | None = None,
) -> None:
    """For the rest of the process: activate the stand-in driver and turn every JIT launch into a compile for
    sm_``arch``, calling ``on_compile`` once per new specialisation. ``forced_options`` (``num_warps``,
    ``num_stages``) replace every launch's own (what-ifs). A kernel that does not compile, or that needs more
    than ``shared_limit`` bytes of shared memory, raises :class:`CompileFailure` from its launch."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(_fake_cuda_driver(arch))
    seen: set[str] = set()
    launch = JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kwargs):
        kwargs.update(forced_options or {})
        try:
            kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as error:  # the compiler's own errors carry the kernel source position
            raise CompileFailure(f"{self.__name__}: {type(error).__name__}: {error}") from error
        if kernel.hash not in seen:
            seen.add(kernel.hash)
            on_compile(CompiledLaunch(self.__name__, kernel, kernel.metadata.num_warps, kernel.metadata.num_stages))
        if kernel.metadata.shared > shared_limit:
            raise CompileFailure(
                f"{self.__name__} needs {kernel.metadata.shared} bytes of shared memory, above {shared_limit}"
            )
        return kernel

    JITFunction.run = compile_instead


def operator_calls(dtype_name: str) -> Iterator[tuple[str, Callable[[], object]]]:
    """(label, call) pairs: each call runs one operator's forward and backward on CPU tensors."""
    import torch
    import torch.nn.functional as F

    from schedlang.kernels import chunk_gated_delta_rule, chunk_gla, chunk_simple_gla
    from schedlang.kernels.log_sigmoid_gate import log_sigmoid_gate
    from schedlang.kernels.mamba2 import chunk_mamba2, pointwise_triton, ssd_skip, ssd_values_and_gates
    from schedlang.kernels.simple_gla.chunk import implementation_for as simple_gla_implementation
    from schedlang.kernels.gla.chunk import implementation_for as gla_implementation
    from schedlang.kernels.gated_rms_norm import gated_rms_norm
    from schedlang.kernels.short_convolution import short_convolution
    from schedlang.kernels.cross_entropy import cross_entropy_rows
    from schedlang.kernels.swiglu import swiglu

    dtype = getattr(torch, dtype_name)
    batch, length, heads = 1, 200, 2

    def leaf(*shape, dtype=dtype):
        return torch.randn(*shape, dtype=dtype).requires_grad_(True)

    def backward(*outputs):
        tensors = [output for output in outputs if output is not None]
        torch.autograd.backward(tensors, [torch.ones_like(tensor) for tensor in tensors])

    def recurrence(operator, key_dim, value_dim, per_key_gate, save_states=False, **extra):
        def call():
            q, k = leaf(batch, length, heads, key_dim), leaf(batch, length, heads, key_dim)
            v = leaf(batch, length, heads, value_dim)
            g = leaf(batch, length, heads, *((key_dim,) if per_key_gate else ()), dtype=torch.float32)
            state = leaf(batch, heads, key_dim, value_dim, dtype=torch.float32)
            arguments = {name: leaf(batch, length, heads, dtype=torch.float32) for name in extra}
            backward(*operator(q, k, v, g, **arguments, initial_state=state, output_final_state=True,
                               backend="triton", save_states=save_states))
        return call

    def span_phases(implementation_for, key_dim, value_dim, per_key_gate):
        def call():
            with torch.no_grad():
                q, k = (torch.randn(batch, length, heads, key_dim, dtype=dtype) for _ in range(2))
                v, do = (torch.randn(batch, length, heads, value_dim, dtype=dtype) for _ in range(2))
                g = torch.randn(batch, length, heads, *((key_dim,) if per_key_gate else ()))
                implementation = implementation_for("triton", q)
                implementation.local_final_state(implementation.prepare_forward(q, k, v, g))
                implementation.local_initial_state_gradient(implementation.prepare_backward(q, k, v, g, do, 1.0))
        return call

    for key_dim, value_dim in ((64, 64), (128, 128), (128, 64), (64, 128)):
        shape = f"K{key_dim} V{value_dim}"
        yield f"chunk_gla {shape}", recurrence(chunk_gla, key_dim, value_dim, True)
        yield f"chunk_simple_gla {shape}", recurrence(chunk_simple_gla, key_dim, value_dim, False)
        yield f"chunk_simple_gla {shape} save_states", recurrence(chunk_simple_gla, key_dim, value_dim, False, True)
        yield f"gla span phases {shape}", span_phases(gla_implementation, key_dim, value_dim, True)
        yield f"simple_gla span phases {shape}", span_phases(simple_gla_implementation, key_dim, value_dim, False)
    for width in (64, 128):
        yield (f"chunk_gated_delta_rule K{width} V{width}",
               recurrence(chunk_gated_delta_rule, width, width, False, beta=None))
        yield (f"chunk_gated_delta_rule K{width} V{width} save_states",
               recurrence(chunk_gated_delta_rule, width, width, False, True, beta=None))

    def mamba2():
        x, B, C = leaf(batch, length, 4, 64), leaf(batch, length, 2, 128), leaf(batch, length, 2, 128)
        dt = F.softplus(torch.randn(batch, length, 4)).requires_grad_(True)
        A, D = (-torch.rand(4) - 0.1).requires_grad_(True), torch.randn(4).requires_grad_(True)
        backward(*chunk_mamba2(x, dt, A, B, C, D, output_final_state=True, backend="triton"))

    def mamba2_ends_apart():  # the mixer's document and sequence-parallel path: each end its own node
        x, o = leaf(batch, length, 4, 64), leaf(batch, length, 4, 64)
        dt = F.softplus(torch.randn(batch, length, 4)).requires_grad_(True)
        A, D = (-torch.rand(4) - 0.1).requires_grad_(True), torch.randn(4).requires_grad_(True)
        backward(*ssd_values_and_gates(x, dt, A, backend="triton"), ssd_skip(o, x, D, backend="triton"))

    def mamba2_ends_backward_in_one_pass():  # SsdFunction's backward for a chunk implementation without the ends
        x, dv, dy = leaf(batch, length, 4, 64), leaf(batch, length, 4, 64), leaf(batch, length, 4, 64)
        dt, dg = F.softplus(torch.randn(batch, length, 4)), torch.randn(batch, length, 4)
        A, D = -torch.rand(4) - 0.1, torch.randn(4)
        pointwise_triton.map_and_skip_backward(x, dt, A, D, dv, dg, dy)

    yield "chunk_mamba2 (map, skip, simple GLA: one node) H4 P64 G2 N128", mamba2
    yield "mamba2's pointwise ends apart H4 P64", mamba2_ends_apart
    yield "mamba2's ends' backward in one pointwise pass H4 P64", mamba2_ends_backward_in_one_pass
    yield "swiglu", lambda: backward(swiglu(leaf(3, 2 * 96), backend="triton"))
    yield "short_convolution W4, bias and history", lambda: backward(short_convolution(
        leaf(batch, length, 96), leaf(96, 4, dtype=torch.float32), leaf(96, dtype=torch.float32),
        leaf(batch, 3, 96), backend="triton"))
    yield "short_convolution W4, zeros before", lambda: backward(
        short_convolution(leaf(batch, length, 96), leaf(96, 4, dtype=torch.float32), backend="triton"))
    yield "gated_rms_norm G1 D2048", lambda: backward(gated_rms_norm(
        leaf(3, 2048), leaf(3, 2048), leaf(2048, dtype=torch.float32), 1, 1e-5, backend="triton"))
    yield "gated_rms_norm G4 D512", lambda: backward(gated_rms_norm(
        leaf(3, 512), leaf(3, 512), leaf(512, dtype=torch.float32), 4, 1e-5, backend="triton"))
    yield "gated_rms_norm norm first, one weight for every head", lambda: backward(gated_rms_norm(
        leaf(3, 4, 128), leaf(3, 4, 128), leaf(128, dtype=torch.float32), 1, 1e-5, True, backend="triton"))
    yield "cross_entropy_rows V32000, the gradient over the logits", lambda: cross_entropy_rows(
        torch.zeros(3, 32000, dtype=dtype), torch.tensor([0, -100, 31999]), -100, True, backend="triton")
    yield "cross_entropy_rows V1000, the loss alone", lambda: cross_entropy_rows(
        torch.zeros(3, 1000, dtype=dtype), torch.tensor([0, -100, 999]), -100, False, backend="triton")
    yield "log_sigmoid_gate", lambda: backward(
        log_sigmoid_gate(leaf(3, 96, dtype=torch.float32), 16.0, backend="triton")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability as one number (default 90)")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--shared-limit", type=int, default=SHARED_LIMIT, help="bytes of shared memory a block may use")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (the interpreter replaces the kernels at import)", file=sys.stderr)
        return 2
    from schedlang.kernels.common.arguments import COMPILE_ONLY_VARIABLE

    os.environ[COMPILE_ONLY_VARIABLE] = "1"
    compiled: list[CompiledLaunch] = []
    named: set[str] = set()

    def report(launch: CompiledLaunch) -> None:
        compiled.append(launch)
        if launch.kernel_name not in named:  # each kernel's first specialisation
            named.add(launch.kernel_name)
            print(f"  {launch.kernel_name:<44} {launch.compiled.metadata.shared:>7} B shared", flush=True)

    compile_only_launches(args.arch, args.shared_limit, report)
    for dtype_name in args.dtypes:
        for label, call in operator_calls(dtype_name):
            print(f"{dtype_name} {label}", flush=True)
            try:
                call()
            except CompileFailure as failure:
                print(f"compile_check: sm_{args.arch}, {dtype_name} {label}: {failure}", file=sys.stderr)
                return 1
    print(f"compile_check: {len(compiled)} kernel specialisations built for sm_{args.arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
