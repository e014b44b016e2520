"""The mamba3 (SISO) operator against simple GLA's chunk kernels on its mapped operands (issue 35).

    python benchmarks/mamba3_kernels.py                       # B=1 T=16K, H 16 and 32, head dim 64, N=128, bf16
    python benchmarks/mamba3_kernels.py --lengths 4096 --heads 16 --check
    python benchmarks/mamba3_kernels.py --layer               # also the whole mamba3 layer's forward+backward

Our operator, ``chunk_mamba3(x, dt, adt, trap, B, C, angles, D)``, is timed whole: the cumulative angles and
rotations, the trapezoid's operands (kernels/mamba3/README.md), one ``chunk_simple_gla`` call, the diagonal
correction and the ``D`` skip; "kernels" is our ``chunk_simple_gla`` alone on the mapped operands, so the map's
own cost shows. fla's Mamba-3 layer only calls mamba_ssm's kernels; with ``--layer`` fla's ``Mamba3`` is timed
beside ours when it imports and mamba_ssm's SISO kernel is there. Each figure is the median of
``--iterations`` calls after ``--warmup`` (CUDA events, benchmarks/common.py ``median_ms``) of the
forward+backward. ``--check`` prints our relative errors against the float32 token-by-token recurrence (slow:
use a short length).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median_ms  # noqa: E402
from benchmarks.installed import import_installed  # noqa: E402
from schedlang.kernels import chunk_simple_gla  # noqa: E402
from schedlang.kernels.mamba3 import (  # noqa: E402
    chunk_mamba3,
    cumulative_angles,
    naive_recurrent_mamba3,
    rotate_pairs,
    trapezoid_operands,
)

ARGUMENTS = ("x", "dt", "adt", "trap", "B", "C", "angles", "D")


def make_inputs(length: int, heads: int, head_dim: int, state_size: int, dtype: torch.dtype,
                device: str = "cuda") -> dict[str, torch.Tensor]:
    """Leaves that require grad, as a Mamba-3 layer makes them: x, B, C in ``dtype``; dt = softplus(noise - 2),
    adt = A dt with A in [-16, -1], trap a sigmoid, the rates pi tanh(noise) for N / 4 angles, D in float32."""
    def leaf(tensor):
        return tensor.to(device).requires_grad_(True)

    dt = F.softplus(torch.randn(1, length, heads) - 2.0)
    return {
        "x": leaf(torch.randn(1, length, heads, head_dim, dtype=dtype)),
        "dt": leaf(dt),
        "adt": leaf(dt * -torch.empty(heads).uniform_(1.0, 16.0)),
        "trap": leaf(torch.sigmoid(torch.randn(1, length, heads))),
        "B": leaf(torch.randn(1, length, heads, state_size, dtype=dtype)),
        "C": leaf(torch.randn(1, length, heads, state_size, dtype=dtype)),
        "angles": leaf(math.pi * torch.tanh(torch.randn(1, length, heads, state_size // 4))),
        "D": leaf(torch.ones(heads)),
    }


def mapped_operands(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(q, k, v, g) as fresh leaves: simple GLA's operands of the update, for the kernels-only timing."""
    with torch.no_grad():
        theta = cumulative_angles(inputs["angles"], inputs["dt"], None)
        q, k = rotate_pairs(inputs["C"], theta), rotate_pairs(inputs["B"], theta)
        operands = trapezoid_operands(q, k, inputs["x"], inputs["dt"], inputs["adt"], inputs["trap"])
        dtype = inputs["x"].dtype
        mapped = (operands.q.to(dtype), operands.k.to(dtype), operands.v, operands.g)
    return tuple(tensor.detach().clone().requires_grad_(True) for tensor in mapped)


def operator_step(inputs: dict[str, torch.Tensor], backend: str = "triton"):
    """One forward+backward of our operator: the gradient of every input."""
    leaves = [inputs[name] for name in ARGUMENTS]
    output_grad = torch.randn_like(inputs["x"])

    def step():
        output, _ = chunk_mamba3(*leaves, backend=backend)
        return torch.autograd.grad(output, leaves, output_grad)

    return step


def simple_gla_step(operands: tuple[torch.Tensor, ...], backend: str = "triton"):
    """One forward+backward of our simple-GLA operator on the mapped operands, scale 1."""
    output_grad = torch.randn_like(operands[2])

    def step():
        output, _ = chunk_simple_gla(*operands, scale=1.0, backend=backend)
        return torch.autograd.grad(output, list(operands), output_grad)

    return step


def relative_errors(inputs: dict[str, torch.Tensor], backend: str = "triton", operator=chunk_mamba3):
    """``operator``'s output and gradients (ours by default) against the float32 token loop."""
    generator = torch.Generator(device=inputs["x"].device).manual_seed(0)
    output_grad = torch.randn(inputs["x"].shape, generator=generator, device=inputs["x"].device)
    results = []
    for function, cast, kwargs in ((operator, lambda t: t, {"backend": backend}),
                                   (naive_recurrent_mamba3, lambda t: t.float(), {})):
        leaves = [cast(inputs[name]).detach().requires_grad_(True) for name in ARGUMENTS]
        output, _ = function(*leaves, **kwargs)
        grads = torch.autograd.grad((output.float() * output_grad).sum(), leaves)
        results.append((output, *grads))
    names = ["y"] + [f"d{name}" for name in ARGUMENTS]
    return {
        name: float((ours.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-30))
        for name, ours, reference in zip(names, *results)
    }


def time_layers(length: int, heads: int, head_dim: int, state_size: int, args) -> None:
    from schedlang.runtime.mixer_mamba3 import Mamba3Mixer
    from schedlang.vocabulary import Mamba3Options, ModelConfig, ModelOptions

    d_model = heads * head_dim // 2
    config = ModelConfig(vocab=256, d_model=d_model, layers=("mamba3",), heads=heads, head_dim=head_dim,
                         norm_eps=1e-5, options=ModelOptions(mamba3=Mamba3Options(state_size=state_size)))
    ours = Mamba3Mixer(config)
    ours.reset_parameters(torch.Generator().manual_seed(0), 0.02)
    ours = ours.to("cuda", torch.bfloat16)
    hidden = torch.randn(1, length, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    output_grad = torch.randn_like(hidden)
    leaves = [hidden, *ours.parameters()]
    label = f"layer T={length} H={heads} P={head_dim} N={state_size} d={d_model} bf16 fwd+bwd"
    mine = median_ms(lambda: torch.autograd.grad(ours(hidden, None)[0], leaves, output_grad), args.warmup,
                     args.iterations)
    line = f"{label}: ours {mine:8.3f} ms"
    try:
        import_installed("fla")  # benchmarks/installed.py: the checkout's own `kernels` off sys.path
        from fla.layers.mamba3 import Mamba3, is_fast_path_available
    except ImportError as error:
        print(line + f"   (fla not available: {error})", flush=True)
        return
    if not is_fast_path_available:
        print(line + "   (fla's Mamba3 needs mamba_ssm's SISO kernel, not installed)", flush=True)
        return
    fla = Mamba3(hidden_size=d_model, state_size=state_size, expand=2, head_dim=head_dim).to("cuda", torch.bfloat16)
    fla_leaves = [hidden, *fla.parameters()]
    theirs = median_ms(lambda: torch.autograd.grad(fla(hidden)[0], fla_leaves, output_grad), args.warmup,
                       args.iterations)
    print(f"{line}   fla (mamba_ssm) {theirs:8.3f} ms   ours/fla {mine / theirs:5.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384])
    parser.add_argument("--heads", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64])
    parser.add_argument("--state-size", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--check", action="store_true", help="relative errors against the float32 recurrence")
    parser.add_argument("--layer", action="store_true", help="also time the whole mamba3 layer (and fla's)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/mamba3_kernels.py times CUDA kernels; no CUDA device is available")
    for length in args.lengths:
        for heads in args.heads:
            for head_dim in args.head_dims:
                torch.manual_seed(length + heads + head_dim)
                inputs = make_inputs(length, heads, head_dim, args.state_size, torch.bfloat16)
                operands = mapped_operands(inputs)
                label = f"T={length} H={heads} P={head_dim} N={args.state_size} bf16 fwd+bwd"
                ours = median_ms(operator_step(inputs), args.warmup, args.iterations)
                kernels = median_ms(simple_gla_step(operands), args.warmup, args.iterations)
                print(f"{label}: mamba3 {ours:8.3f} ms   kernels {kernels:8.3f} ms   map {ours / kernels:5.2f}x",
                      flush=True)
                if args.check:
                    errors = relative_errors(inputs)
                    listed = " ".join(f"{name} {error:.1e}" for name, error in errors.items())
                    print(f"{label} relative errors: {listed}", flush=True)
                if args.layer:
                    time_layers(length, heads, head_dim, args.state_size, args)
                del inputs, operands
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
