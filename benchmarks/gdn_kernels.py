"""Gated DeltaNet's chunked operator against flash-linear-attention's chunk_gated_delta_rule (issue 19).

    python benchmarks/gdn_kernels.py                         # 4K with state in and out, 16K without; B=1 H=16 D=128 bf16
    python benchmarks/gdn_kernels.py --lengths 4096 --check  # also the relative errors against the float32 recurrence
    python benchmarks/gdn_kernels.py --launch-table tuned.json  # under benchmarks/tune_kernels.py's overrides
    python benchmarks/gdn_kernels.py --launch-table a.json b.json --no-peer  # ours under each table, one job

Inputs as Gated DeltaNet's layer makes them (benchmarks/kernels.py make_inputs: unit-norm keys, beta in (0, 1)).
Each case times the forward (no autograd) and the forward+backward (torch.autograd.grad of the output, and of the
final state when there is one) with CUDA events: ``--iterations`` timed calls after ``--warmup`` untimed ones,
the median printed, with the ratio ours / fla's when flash-linear-attention imports. ``--save-states`` times our
operator with its forward's chunk states kept for the backward. ``--check`` compares our outputs and gradients
(and fla's, when present) with the token-by-token recurrence in float32 on the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median_ms  # noqa: E402
from benchmarks.kernels import gradient_step, import_launch_tables, load_peer, make_inputs  # noqa: E402
from schedlang.kernels.common.launch_tables import launch_overrides  # noqa: E402
from schedlang.kernels.gdn import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule  # noqa: E402

CASES = {4096: True, 16384: False}
"""Sequence length -> whether the case passes an initial state and asks for the final state (the issue's two)."""


def time_case(function, inputs, with_state: bool, warmup: int, iterations: int) -> dict[str, float]:
    *operands, state = inputs

    def forward():
        with torch.no_grad():
            return function(*operands, initial_state=state, output_final_state=with_state)

    return {
        "fwd_ms": median_ms(forward, warmup, iterations),
        "fwdbwd_ms": median_ms(gradient_step(function, inputs, with_state), warmup, iterations),
    }


def relative_errors(function, inputs, with_state: bool) -> dict[str, float]:
    """Relative errors (Frobenius) of the output, final state and every gradient against the float32 recurrence."""
    *operands, state = inputs
    names = ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta"] + (["d_initial_state"] if with_state else [])
    results = []
    for candidate, cast in ((function, lambda t: t), (naive_recurrent_gated_delta_rule, lambda t: t.detach().float())):
        leaves = [cast(t).detach().requires_grad_(True) if t is not None else None for t in (*operands, state)]
        *ops, initial = leaves
        generator = torch.Generator(device=operands[0].device).manual_seed(0)
        output, final_state = candidate(*ops, initial_state=initial, output_final_state=True)
        output_grad = torch.randn(output.shape, generator=generator, device=output.device)
        state_grad = torch.randn(final_state.shape, generator=generator, device=output.device)
        loss = (output.float() * output_grad).sum() + (final_state.float() * state_grad).sum()
        grads = torch.autograd.grad(loss, [leaf for leaf in leaves if leaf is not None])
        results.append([output, final_state, *grads])
    return {
        name: float((ours.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-30))
        for name, ours, reference in zip(names, *results)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=sorted(CASES))
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--save-states", action="store_true", help="time our operator with save_states=True")
    parser.add_argument("--check", action="store_true", help="relative errors against the float32 recurrence")
    parser.add_argument(
        "--launch-table", type=Path, nargs="+", default=[], help="launch-table overrides to time with, {table: "
        "{entry: {knob: value}}} (benchmarks/tune_kernels.py --out); several: ours is timed under each in turn",
    )
    parser.add_argument("--no-peer", action="store_true", help="do not time flash-linear-attention")
    args = parser.parse_args()
    import_launch_tables()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gdn_kernels.py times CUDA kernels; no CUDA device is available")
    peers = None if args.no_peer else load_peer()
    tables = {path.name: json.loads(path.read_text()) for path in args.launch_table} or {"": {}}
    run_cases(args, tables, None if peers is None else peers["gdn"])


def run_cases(args: argparse.Namespace, tables: dict[str, dict], fla) -> None:
    """Each length: fla once (when given), then ours under each launch table, printed with the ratio to fla."""

    def ours(*operands, **kwargs):
        return chunk_gated_delta_rule(*operands, save_states=args.save_states, **kwargs)

    for length in args.lengths:
        with_state = CASES.get(length, True)
        torch.manual_seed(length)
        inputs = make_inputs("gdn", length, args.heads, args.head_dim, with_state)
        label = f"T={length} H={args.heads} D={args.head_dim} bf16" + (" state in/out" if with_state else "")
        peer = None if fla is None else time_case(fla, inputs, with_state, args.warmup, args.iterations)
        for table_name, overrides in tables.items():
            with launch_overrides(overrides):
                timings = time_case(ours, inputs, with_state, args.warmup, args.iterations)
                for phase in ("fwd_ms", "fwdbwd_ms"):
                    line = f"{label} {table_name} {phase[:-3]:>7}: ours {timings[phase]:8.3f} ms"
                    if peer is not None:
                        ratio = timings[phase] / peer[phase]
                        line += f"   fla {peer[phase]:8.3f} ms   ours/fla {ratio:5.2f}x"
                    print(line, flush=True)
                if args.check:
                    errors = relative_errors(ours, inputs, with_state)
                    print(f"{label} {table_name} ours relative errors: " + " ".join(f"{k} {v:.1e}" for k, v in errors.items()), flush=True)
        if args.check and fla is not None:
            errors = relative_errors(fla, inputs, with_state)
            print(f"{label} fla relative errors: " + " ".join(f"{k} {v:.1e}" for k, v in errors.items()), flush=True)


if __name__ == "__main__":
    main()
