"""The mamba2 SSD operator against flash-linear-attention's chunk_simple_gla on the equivalent inputs (issue 35).

    python benchmarks/mamba2_kernels.py                       # B=1 T=16K, H 16 and 32, head dim 64 and 128, N=128, bf16
    python benchmarks/mamba2_kernels.py --lengths 4096 --heads 16 --head-dims 64 --check
    python benchmarks/mamba2_kernels.py --layer               # also the whole mamba2 layer's forward+backward
    python benchmarks/mamba2_kernels.py --graphs --per-head   # also replayed from CUDA graphs; B, C per head

Our operator, ``chunk_mamba2(x, dt, A, B, C, D)``, is timed whole: the map onto simple GLA's operands
(``q = C``, ``k = B``, read by group in the chunk kernels, ``v = dt x``, ``g = dt A``; kernels/mamba2/README.md),
the chunk kernels and the ``D`` skip. fla's Mamba-2 layer needs ``mamba_ssm``'s kernels, so its peer is fla's
``chunk_simple_gla`` on the already mapped operands (scale 1, B and C repeated per head), the same recurrence
without the map; our ``chunk_simple_gla`` on those operands is printed too ("kernels"), so the map's own cost
shows. Each figure is the median of ``--iterations`` calls after ``--warmup`` (CUDA events, benchmarks/common.py
``median_ms``) of the forward+backward (torch.autograd.grad of the output for a random output gradient), the
host's launches included; ``--graphs`` also times each replayed from a CUDA graph, the GPU's time alone (what a
step under ``cuda_graphs = step`` pays), ``--host`` the host's own time in each eager step (near the eager
figure, the step is bound by its launches), and ``--per-head`` the operator as it was composed before (B and C
copied per head, three autograd nodes), in the same job. ``--layer`` times schedlang's
mamba2 mixer (``d_model = H P / 2``, fla's ``expand = 2``) the same way, and fla's ``Mamba2`` layer beside it
when fla imports (without ``mamba_ssm`` fla runs its PyTorch path, which the line says). ``--check`` prints our
relative errors against the float32 token-by-token recurrence (slow: use a short length).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import capture_graph, host_ms, kernel_seconds_of_step, median_ms  # noqa: E402
from benchmarks.installed import import_installed  # noqa: E402
from schedlang.kernels import chunk_simple_gla  # noqa: E402
from schedlang.kernels.mamba2 import chunk_mamba2, naive_recurrent_mamba2, ssd_operands  # noqa: E402

SSD_ARGUMENTS = ("x", "dt", "A", "B", "C", "D")


def make_ssd_inputs(length: int, heads: int, head_dim: int, state_size: int, groups: int, dtype: torch.dtype,
                    device: str = "cuda") -> dict[str, torch.Tensor]:
    """Leaves that require grad, as a Mamba-2 layer makes them: x, B, C in ``dtype``; dt = softplus(noise - 2)
    and A = -exp(A_log), A_log = log U(1, 16), and D in float32."""
    def leaf(tensor):
        return tensor.to(device).requires_grad_(True)

    return {
        "x": leaf(torch.randn(1, length, heads, head_dim, dtype=dtype)),
        "dt": leaf(F.softplus(torch.randn(1, length, heads) - 2.0)),
        "A": leaf(-torch.empty(heads).uniform_(1.0, 16.0)),
        "B": leaf(torch.randn(1, length, groups, state_size, dtype=dtype)),
        "C": leaf(torch.randn(1, length, groups, state_size, dtype=dtype)),
        "D": leaf(torch.ones(heads)),
    }


def mapped_operands(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(q, k, v, g) as fresh leaves: simple GLA's operands of the SSD, for the kernels-only timings."""
    with torch.no_grad():
        operands = ssd_operands(*(inputs[name] for name in SSD_ARGUMENTS[:5]))
    mapped = (operands.q, operands.k, operands.v, operands.g)
    return tuple(tensor.detach().clone().requires_grad_(True) for tensor in mapped)


def ssd_step(inputs: dict[str, torch.Tensor], backend: str = "triton"):
    """One forward+backward of our operator: the gradients of x, dt, A, B, C and D."""
    leaves = [inputs[name] for name in SSD_ARGUMENTS]
    output_grad = torch.randn_like(inputs["x"])

    def step():
        output, _ = chunk_mamba2(*leaves, backend=backend)
        return torch.autograd.grad(output, leaves, output_grad)

    return step


def per_head_ssd_step(inputs: dict[str, torch.Tensor], backend: str = "triton"):
    """The operator composed as it was before it became one autograd node: B and C repeated per head
    (``ssd_operands`` without ``grouped``), ``chunk_simple_gla``, the skip, each its own node, dx added by
    autograd; the baseline of the grouped read and the one-pass backward, for a same-job ratio."""
    from schedlang.kernels.mamba2 import ssd_skip

    leaves = [inputs[name] for name in SSD_ARGUMENTS]
    output_grad = torch.randn_like(inputs["x"])

    def step():
        operands = ssd_operands(*leaves[:5], backend=backend)
        output, _ = chunk_simple_gla(operands.q, operands.k, operands.v, operands.g, scale=1.0, backend=backend)
        output = ssd_skip(output.to(leaves[0].dtype), leaves[0], leaves[5], backend)
        return torch.autograd.grad(output, leaves, output_grad)

    return step


def replayed_ms(step, args) -> tuple[float, float]:
    """``step`` captured once in a CUDA graph: (median replay milliseconds, the largest relative difference of the
    replayed gradients from an eager call's). Without the host's launches: the GPU's own time, what a step
    replayed from graphs (``cuda_graphs = step``) pays."""
    eager = step()
    graph, captured = capture_graph(step)
    difference = max(((replayed.float() - reference.float()).norm() / reference.float().norm()).item()
                     for replayed, reference in zip(captured, eager))
    return median_ms(graph.replay, args.warmup, args.iterations), difference


def simple_gla_step(function, operands: tuple[torch.Tensor, ...], **kwargs):
    """One forward+backward of a simple-GLA operator on the mapped operands, scale 1."""
    output_grad = torch.randn_like(operands[2])

    def step():
        output, _ = function(*operands, scale=1.0, **kwargs)
        return torch.autograd.grad(output, list(operands), output_grad)

    return step


def relative_errors(
    inputs: dict[str, torch.Tensor], backend: str = "triton", operator=chunk_mamba2
) -> dict[str, float]:
    """``operator``'s output and gradients (ours by default) against the float32 token loop
    (``naive_recurrent_mamba2``)."""
    generator = torch.Generator(device=inputs["x"].device).manual_seed(0)
    output_grad = torch.randn(inputs["x"].shape, generator=generator, device=inputs["x"].device)
    results = []
    for function, cast, kwargs in ((operator, lambda t: t, {"backend": backend}),
                                   (naive_recurrent_mamba2, lambda t: t.float(), {})):
        leaves = [cast(inputs[name]).detach().requires_grad_(True) for name in SSD_ARGUMENTS]
        output, _ = function(*leaves, **kwargs)
        grads = torch.autograd.grad((output.float() * output_grad).sum(), leaves)
        results.append((output, *grads))
    names = ["y"] + [f"d{name}" for name in SSD_ARGUMENTS]
    return {
        name: float((ours.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-30))
        for name, ours, reference in zip(names, *results)
    }


def load_fla_simple_gla():
    try:
        import_installed("fla")  # benchmarks/installed.py: the checkout's own `kernels` off sys.path
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.simple_gla import chunk_simple_gla as fla_simple_gla
    except ImportError as error:
        print(f"flash-linear-attention not available ({error}); timing schedlang alone", file=sys.stderr)
        return None
    fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # as benchmarks/kernels.py: fla's own switch for Triton 3.6
    return fla_simple_gla


def layer_step(layer, hidden: torch.Tensor, call):
    """One forward+backward of a layer: the gradients of its input and parameters."""
    leaves = [hidden, *layer.parameters()]
    output_grad = torch.randn_like(hidden)

    def step():
        return torch.autograd.grad(call(hidden), leaves, output_grad)

    return step


def our_layer(heads: int, head_dim: int, state_size: int, groups: int, device: str = "cuda",
              dtype: torch.dtype = torch.bfloat16):
    """schedlang's mamba2 mixer at fla's ``expand = 2`` (``d_model = H P / 2``), initialised, on ``device``."""
    from schedlang.runtime.mixer_mamba2 import Mamba2Mixer
    from schedlang.vocabulary import Mamba2Options, ModelConfig, ModelOptions

    d_model = heads * head_dim // 2
    config = ModelConfig(vocab=256, d_model=d_model, layers=("mamba2",), heads=heads, head_dim=head_dim,
                         norm_eps=1e-5, options=ModelOptions(mamba2=Mamba2Options(state_size, groups)))
    layer = Mamba2Mixer(config)
    layer.reset_parameters(torch.Generator().manual_seed(0), 0.02)
    return layer.to(device, dtype)


def time_layers(length: int, heads: int, head_dim: int, state_size: int, groups: int, args) -> None:
    d_model = heads * head_dim // 2
    ours = our_layer(heads, head_dim, state_size, groups)
    hidden = torch.randn(1, length, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    label = f"layer T={length} H={heads} P={head_dim} N={state_size} d={d_model} bf16 fwd+bwd"
    mine = median_ms(layer_step(ours, hidden, lambda h: ours(h, None)[0]), args.warmup, args.iterations)
    line = f"{label}: ours {mine:8.3f} ms"
    try:
        import_installed("fla")  # benchmarks/installed.py: the checkout's own `kernels` off sys.path
        from fla.layers.mamba2 import Mamba2, is_fast_path_available
    except ImportError:
        print(line + "   (fla not available)", flush=True)
        return
    fla = Mamba2(num_heads=heads, head_dim=head_dim, hidden_size=d_model, state_size=state_size, expand=2,
                 n_groups=groups, norm_eps=1e-5).to("cuda", torch.bfloat16)
    path = "mamba_ssm kernels" if is_fast_path_available else "its PyTorch path: no mamba_ssm"
    try:
        theirs = median_ms(layer_step(fla, hidden, lambda h: fla(h)[0]), args.warmup, args.iterations)
    except torch.OutOfMemoryError:  # fla's PyTorch path at 16K asked an H100 for 32 GiB more: report it, go on
        print(f"{line}   fla out of memory ({path})", flush=True)
        del fla
        torch.cuda.empty_cache()
        return
    print(f"{line}   fla {theirs:8.3f} ms ({path})   ours/fla {mine / theirs:5.2f}x", flush=True)


PEER = "fla chunk_simple_gla"


def compared_steps(inputs, operands, fla, backend: str = "triton") -> dict[str, Callable[[], tuple]]:
    """The steps each line compares, by name: our operator ("mamba2"), our ``chunk_simple_gla`` on the mapped
    operands ("kernels") and, when ``fla`` is given, fla's on the same operands (:data:`PEER`)."""
    steps = {"mamba2": ssd_step(inputs, backend),
             "kernels": simple_gla_step(chunk_simple_gla, operands, backend=backend)}
    if fla is not None:
        steps[PEER] = simple_gla_step(fla, operands)
    return steps


def timed_line(prefix: str, milliseconds: dict[str, float]) -> str:
    """``prefix`` then each step's milliseconds, and mamba2/fla when the peer was timed."""
    line = prefix + "   ".join(f"{name} {value:8.3f} ms" for name, value in milliseconds.items())
    if PEER in milliseconds:
        line += f"   mamba2/fla {milliseconds['mamba2'] / milliseconds[PEER]:5.2f}x"
    return line


def replayed_line(label: str, steps: dict[str, Callable[[], tuple]], args) -> str:
    """Each step replayed from a CUDA graph (:func:`replayed_ms`), and how far our replayed gradients are from an
    eager call's."""
    replayed = {name: replayed_ms(step, args) for name, step in steps.items()}
    line = timed_line(f"{label} replayed from a CUDA graph: ", {name: ms for name, (ms, _) in replayed.items()})
    return f"{line}   mamba2 replay against eager {replayed['mamba2'][1]:.1e}"


def host_line(label: str, steps: dict[str, Callable[[], tuple]], args) -> str:
    """The host's own milliseconds in each eager step (:func:`benchmarks.common.host_ms`): near the eager median, a
    step is bound by its launches, not by the GPU."""
    return timed_line(f"{label} host time: ",
                      {name: host_ms(step, args.warmup, args.iterations) for name, step in steps.items()})


def print_kernel_table(label: str, step, median: float) -> None:
    """Our operator's forward+backward by kernel (one profiled step), and the share of the median step the kernels
    leave idle (launch gaps: the host's time)."""
    compute, _, by_name = kernel_seconds_of_step(step, torch.device("cuda"))
    print(f"{label} kernels {compute * 1e3:.3f} ms of {median:.3f} ms median "
          f"({max(0.0, 1 - compute * 1e3 / median):.0%} idle):", flush=True)
    for name, seconds in by_name.items():
        print(f"    {seconds * 1e3:8.3f} ms  {name[:110]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384])
    parser.add_argument("--heads", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--state-size", type=int, default=128)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--check", action="store_true", help="relative errors against the float32 recurrence")
    parser.add_argument("--layer", action="store_true", help="also time the whole mamba2 layer (and fla's)")
    parser.add_argument("--no-peer", action="store_true", help="do not time flash-linear-attention")
    parser.add_argument("--graphs", action="store_true",
                        help="also time each forward+backward replayed from a CUDA graph (no host launches)")
    parser.add_argument("--per-head", action="store_true",
                        help="also time the operator composed as before: B and C per head, three autograd nodes")
    parser.add_argument("--profile", action="store_true",
                        help="also list our operator's fwd+bwd GPU time by kernel (torch.profiler), largest first")
    parser.add_argument("--host", action="store_true",
                        help="also the host's milliseconds inside each eager step (ours, our kernels, fla's)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/mamba2_kernels.py times CUDA kernels; no CUDA device is available")
    fla = None if args.no_peer else load_fla_simple_gla()
    for length in args.lengths:
        for heads in args.heads:
            for head_dim in args.head_dims:
                torch.manual_seed(length + heads + head_dim)
                inputs = make_ssd_inputs(length, heads, head_dim, args.state_size, args.groups, torch.bfloat16)
                operands = mapped_operands(inputs)
                label = f"T={length} H={heads} P={head_dim} N={args.state_size} G={args.groups} bf16 fwd+bwd"
                steps = compared_steps(inputs, operands, fla)
                eager = {name: median_ms(step, args.warmup, args.iterations) for name, step in steps.items()}
                if args.per_head:
                    eager["per-head B, C"] = median_ms(per_head_ssd_step(inputs), args.warmup, args.iterations)
                    eager["grouped again"] = median_ms(steps["mamba2"], args.warmup, args.iterations)
                print(timed_line(f"{label}: ", eager), flush=True)
                if args.host:
                    print(host_line(label, steps, args), flush=True)
                if args.graphs:
                    print(replayed_line(label, steps, args), flush=True)
                if args.profile:
                    print_kernel_table(label, steps["mamba2"], eager["mamba2"])
                if args.check:
                    errors = relative_errors(inputs)
                    listed = " ".join(f"{name} {error:.1e}" for name, error in errors.items())
                    print(f"{label} relative errors: {listed}", flush=True)
                if args.layer:
                    time_layers(length, heads, head_dim, args.state_size, args.groups, args)
                del inputs, operands, steps
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
