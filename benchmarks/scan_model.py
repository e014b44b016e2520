"""The simulator's alpha-beta prediction of the cross-rank state scan, 2 to 256 ranks, per method.

No device: this prints what ``schedlang.lowering.cost.state_scan_seconds`` predicts for one direction of one
layer's scan, so the shape can be held against ZeCO's measurements (its Figure 3: All-Scan 2.16 ms against
All-Gather 8.51 ms at 256 H100s) and against ours once measured::

    python benchmarks/scan_model.py --state-bytes 1048576 --latency-us 10 --bandwidth-gbs 50
"""

from __future__ import annotations

import argparse

from schedlang.lowering.cost import Hardware, state_scan_seconds
from schedlang.vocabulary import SequenceParallelMethod

RANKS = (2, 4, 8, 16, 32, 64, 128, 256)


def prediction_rows(state_bytes: float, hardware: Hardware, block_counts: tuple[int, ...]) -> list[tuple[str, list[float]]]:
    """(method label, predicted milliseconds for each of RANKS) rows."""
    variants = [("ring", SequenceParallelMethod.RING, 1)]
    variants += [(f"allscan({blocks})", SequenceParallelMethod.ALLSCAN, blocks) for blocks in block_counts]
    variants.append(("allgather", SequenceParallelMethod.ALLGATHER, 1))
    return [
        (label, [state_scan_seconds(method, ranks, blocks, state_bytes, hardware) * 1e3 for ranks in RANKS])
        for label, method, blocks in variants
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-bytes", type=float, default=16 * 128 * 128 * 4, help="one layer's state, all heads")
    parser.add_argument("--latency-us", type=float, default=Hardware().latency_s * 1e6)
    parser.add_argument("--bandwidth-gbs", type=float, default=Hardware().bandwidth_bytes_per_s / 1e9)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16])
    arguments = parser.parse_args(argv)
    hardware = Hardware(latency_s=arguments.latency_us * 1e-6, bandwidth_bytes_per_s=arguments.bandwidth_gbs * 1e9)
    rows = prediction_rows(arguments.state_bytes, hardware, tuple(arguments.blocks))
    print("| method | " + " | ".join(f"P={ranks}" for ranks in RANKS) + " |")
    print("|---|" + "---|" * len(RANKS))
    for label, milliseconds in rows:
        print(f"| {label} | " + " | ".join(f"{value:.3f}" for value in milliseconds) + " |")


if __name__ == "__main__":
    main()
