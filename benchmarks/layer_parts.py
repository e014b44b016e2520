"""The fused layer parts against the PyTorch ops they replace and flash-linear-attention's kernels (issues 35, 37).

    python benchmarks/layer_parts.py                  # T=32K, the 1B models' widths, bf16, CUDA
    python benchmarks/layer_parts.py --device cpu --length 256 --iterations 3   # a smoke run without a GPU

Each row is one part, forward+backward (torch.autograd.grad of the output for a random output gradient), the
median of ``--iterations`` calls after ``--warmup`` (CUDA events, benchmarks/common.py ``median_ms``), host
launches included, for each system in the same process:

* ``short conv``: the causal depthwise convolution with SiLU over a column slice of a fused projection, with a
  history (Mamba-2's x, B, C: ``--conv-channels`` of a row ``--conv-row`` wide; gdn's q, k, v convolutions are
  the same kernel). ``schedlang`` is ``short_convolution``; ``torch`` is the layer's former PyTorch form
  (concatenate the history, ``F.conv1d`` on the transposed tensor, SiLU); ``fla`` is fla's ``causal_conv1d``
  (Triton backend, ``activation="silu"``) on the same slice and history (its ``[B, C, W]`` cache: the history
  in the last ``W - 1`` places).
* ``norm, gate first``: Mamba-2's ``rmsnorm(v silu(z)) w`` over ``--width`` channels. ``torch`` is the layer's
  former float32 composition. fla's Mamba-2 norm is part of ``mamba_ssm``'s path: no fla row.
* ``norm first``: GLA's and Gated DeltaNet's per-head ``rmsnorm(o) w silu(g)`` (``--heads`` heads of
  ``--head-dim``, one weight for every head). ``torch`` is ``F.rms_norm`` then ``* F.silu(g)``; ``fla`` is
  fla's ``rms_norm_gated`` (its ``FusedRMSNormGated``).

Every system's output is checked against ``schedlang``'s (relative error printed) before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median_ms  # noqa: E402
from benchmarks.installed import import_installed  # noqa: E402
from schedlang.kernels.gated_rms_norm import gated_rms_norm  # noqa: E402
from schedlang.kernels.short_convolution import short_convolution  # noqa: E402


def _torch_convolution(inputs, weight, bias, history):
    padded = torch.cat((history, inputs), dim=1)
    mixed = F.conv1d(padded.transpose(1, 2), weight[:, None].to(inputs.dtype), bias.to(inputs.dtype),
                     groups=weight.shape[0]).transpose(1, 2)
    return F.silu(mixed)


def _torch_gate_first(values, gate, weight):
    gated = values.float() * F.silu(gate.float())
    return (F.rms_norm(gated, (gated.shape[-1],), eps=1e-5) * weight.float()).to(values.dtype)


def _torch_norm_first(values, gate, weight):
    return F.rms_norm(values, (values.shape[-1],), weight.to(values.dtype), 1e-5) * F.silu(gate)


def part_cases(args, device, dtype):
    """{part: (leaves, {system: function of the leaves})}, fla's systems only where fla imports."""
    def leaf(*shape, scale=1.0, dtype=dtype):
        return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype).requires_grad_(True)

    length, channels, taps = args.length, args.conv_channels, args.conv_taps
    projection = leaf(1, length, args.conv_row)
    history = leaf(1, taps - 1, channels)
    conv_weight, conv_bias = leaf(channels, taps, scale=0.5, dtype=torch.float32), leaf(channels, dtype=torch.float32)

    def columns(function):
        return lambda projection, *rest: function(projection[..., 7 : 7 + channels], *rest)

    convolution = {
        "schedlang": columns(lambda x, w, b, h: short_convolution(x, w, b, h, backend=args.backend)),
        "torch": columns(_torch_convolution),
    }
    width, heads, head_dim = args.width, args.heads, args.head_dim
    gate_first = {
        "schedlang": lambda v, z, w: gated_rms_norm(v, z, w, 1, 1e-5, backend=args.backend),
        "torch": _torch_gate_first,
    }
    norm_first = {
        "schedlang": lambda o, g, w: gated_rms_norm(o, g, w, 1, 1e-5, norm_before_gate=True, backend=args.backend),
        "torch": _torch_norm_first,
    }
    if device.type == "cuda" and not args.no_peer:
        import_installed("fla")
        from fla.modules.convolution import causal_conv1d
        from fla.modules.fused_norm_gate import rms_norm_gated

        convolution["fla"] = columns(lambda x, w, b, h: causal_conv1d(
            x, w, b, initial_state=F.pad(h.transpose(1, 2), (1, 0)), activation="silu", backend="triton")[0])
        norm_first["fla"] = lambda o, g, w: rms_norm_gated(o, g, w, None, activation="swish", eps=1e-5)
    return {
        f"short conv C{channels} of {args.conv_row} W{taps}": ((projection, conv_weight, conv_bias, history),
                                                              convolution),
        f"norm, gate first D{width}": ((leaf(1, length, width), leaf(1, length, width, scale=2.0),
                                        leaf(width, dtype=torch.float32)), gate_first),
        f"norm first H{heads}x{head_dim}": ((leaf(1, length, heads, head_dim), leaf(1, length, heads, head_dim),
                                             leaf(head_dim, dtype=torch.float32)), norm_first),
    }


def relative_error(output, expected) -> float:
    return ((output.float() - expected.float()).norm() / expected.float().norm()).item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--conv-channels", type=int, default=2304, help="Mamba-2 1B: x (2048) + B + C (2 x 128)")
    parser.add_argument("--conv-row", type=int, default=4368, help="the fused input projection's width")
    parser.add_argument("--conv-taps", type=int, default=4)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--no-peer", action="store_true", help="skip fla")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    args.backend = "triton" if device.type == "cuda" else "torch"
    torch.manual_seed(0)
    for part, (leaves, systems) in part_cases(args, device, dtype).items():
        expected = systems["schedlang"](*leaves).detach()
        output_grad = torch.randn_like(expected)
        cells = []
        for name, function in systems.items():
            error = relative_error(function(*leaves), expected)

            def step(function=function):
                return torch.autograd.grad(function(*leaves), leaves, output_grad)

            milliseconds = median_ms(step, args.warmup, args.iterations, device)
            cells.append(f"{name} {milliseconds:7.3f} ms (error {error:.1e})")
        print(f"T={args.length} {part} {str(dtype).removeprefix('torch.')} fwd+bwd: " + "   ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
