"""StateFlow's two-segment overlap of our gdn Triton path ([Note: gdn overlap], issue 19) against one segment
and against flash-linear-attention's chunk_gated_delta_rule.

    python benchmarks/gdn_overlap.py                       # T = 4K, 16K, 32K; B=1 H=16 D=128 bf16; fla too
    python benchmarks/gdn_overlap.py --no-peer --regions   # ours alone, and the forward and backward alone
    python benchmarks/gdn_overlap.py --lengths 16384 --splits 0.6 0.7 --state-block-v 16 32   # more of the sweep

Each length times our operator under one segment (the launch table's "overlap" entry at segments 1), then under
two segments at each of ``--splits`` (the first segment's share of the kernel chunks), each also under every
``--state-block-v`` (the state pass's value tile, forward and backward: Eq. 16's knob) when given. Times are
medians of CUDA-event timings (benchmarks/gdn_kernels.py: the forward without autograd, and forward+backward
through torch.autograd.grad), printed with the ratio to the first schedule of the length and, unless
``--no-peer``, to fla. Inputs as benchmarks/gdn_kernels.py draws them (state in and out at 4K only).

``--regions`` also times the paper's two regions (Table 4a) alone, under every schedule: the forward's
Pre + ST + Out (the operator's forward) and the backward's replay, output gradients, backward state pass and
per-chunk gradients (the operator's backward, timed as torch.autograd.grad over a kept graph), printed as the
speed-up of each schedule over one segment, and for fla the same two regions. fla's first call autotunes for
minutes; with ``--no-peer`` a run of the defaults stays within a few minutes on an H200.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median_ms  # noqa: E402
from benchmarks.gdn_kernels import CASES, time_case  # noqa: E402
from benchmarks.kernels import import_launch_tables, load_peer, make_inputs  # noqa: E402
from schedlang.kernels.common.launch_tables import launch_overrides  # noqa: E402
from schedlang.kernels.gdn import chunk_gated_delta_rule  # noqa: E402

LENGTHS = [4096, 16384, 32768]
SPLITS = [0.25, 0.5, 0.75]


@dataclass(frozen=True)
class Schedule:
    """One configuration of our operator: a name to print and the launch-table overrides that select it."""

    name: str
    overrides: dict


def schedules(splits: list[float], state_block_v: list[int]) -> list[Schedule]:
    """One segment, then two segments at each split, each under the table's state-pass tile and each of
    ``state_block_v``; the first is the baseline the others' ratios divide by."""
    tiles = [None, *state_block_v]
    chosen = []
    for segments, split in [(1, 0.5), *((2, split) for split in splits)]:
        for tile in tiles:
            overrides = {"overlap": {"segments": segments, "split": split}}
            name = "segments=1" if segments == 1 else f"segments=2 split={split:.2f}"
            if tile is not None:
                overrides.update(forward={"block_v": tile}, backward={"block_v": tile})
                name += f" state BV={tile}"
            chosen.append(Schedule(name, {"gdn": overrides}))
    return chosen


def regions_ms(function, inputs, with_state: bool, warmup: int, iterations: int) -> dict[str, float]:
    """The forward alone (no autograd) and the backward alone: torch.autograd.grad over one forward's graph, kept
    between calls, for a random output gradient (and final-state gradient)."""
    *operands, state = inputs
    leaves = [tensor for tensor in inputs if tensor is not None]
    output, final_state = function(*operands, initial_state=state, output_final_state=with_state)
    outputs, grads = [output], [torch.randn_like(output)]
    if with_state:
        outputs.append(final_state)
        grads.append(torch.randn_like(final_state))

    def forward():
        with torch.no_grad():
            return function(*operands, initial_state=state, output_final_state=with_state)

    def backward():
        return torch.autograd.grad(outputs, leaves, grads, retain_graph=True)

    return {"forward": median_ms(forward, warmup, iterations), "backward": median_ms(backward, warmup, iterations)}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--splits", type=float, nargs="+", default=SPLITS, help="first segment's share, in (0, 1)")
    parser.add_argument("--state-block-v", type=int, nargs="*", default=[], help="state-pass value tiles to add")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--save-states", action="store_true", help="time our operator with save_states=True")
    parser.add_argument("--regions", action="store_true", help="also the forward and the backward alone")
    parser.add_argument("--no-peer", action="store_true", help="do not time flash-linear-attention")
    args = parser.parse_args(argv)
    if any(not 0.0 < split < 1.0 for split in args.splits):
        parser.error(f"--splits must lie strictly between 0 and 1, got {args.splits}")
    if not torch.cuda.is_available():
        parser.error("benchmarks/gdn_overlap.py times CUDA streams and kernels: it needs a CUDA GPU")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    import_launch_tables()
    peers = None if args.no_peer else load_peer()
    fla = None if peers is None else peers["gdn"]
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)

    def ours(*operands, **kwargs):
        return chunk_gated_delta_rule(*operands, save_states=args.save_states, **kwargs)

    for length in args.lengths:
        with_state = CASES.get(length, False)
        torch.manual_seed(length)
        inputs = make_inputs("gdn", length, args.heads, args.head_dim, with_state)
        label = f"T={length} H={args.heads} D={args.head_dim} bf16" + (" state in/out" if with_state else "")
        peer = None if fla is None else time_case(fla, inputs, with_state, args.warmup, args.iterations)
        peer_regions = None
        if fla is not None and args.regions:
            peer_regions = regions_ms(fla, inputs, with_state, args.warmup, args.iterations)
            print(f"{label} fla regions: forward {peer_regions['forward']:.3f} ms  backward "
                  f"{peer_regions['backward']:.3f} ms", flush=True)
        baseline = baseline_regions = None
        for schedule in schedules(args.splits, args.state_block_v):
            with launch_overrides(schedule.overrides):
                timings = time_case(ours, inputs, with_state, args.warmup, args.iterations)
                regions = regions_ms(ours, inputs, with_state, args.warmup, args.iterations) if args.regions else None
            baseline = baseline or timings
            baseline_regions = baseline_regions or regions
            for phase in ("fwd_ms", "fwdbwd_ms"):
                line = (f"{label} {schedule.name:<34} {phase[:-3]:>7}: {timings[phase]:8.3f} ms   "
                        f"/ one segment {timings[phase] / baseline[phase]:5.3f}x")
                if peer is not None:
                    line += f"   fla {peer[phase]:8.3f} ms   ours/fla {timings[phase] / peer[phase]:5.3f}x"
                print(line, flush=True)
            if regions is not None:
                line = f"{label} {schedule.name:<34} regions:"
                for region in ("forward", "backward"):
                    line += (f"  {region} {regions[region]:8.3f} ms (speed-up over one segment "
                             f"{baseline_regions[region] / regions[region]:5.3f}x")
                    if peer_regions is not None:
                        line += f", over fla {peer_regions[region] / regions[region]:5.3f}x"
                    line += ")"
                print(line, flush=True)
        del inputs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
