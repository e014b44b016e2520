"""The backward's two chunk-state scans as one launch or two, with and without boundary states ([Note: paired
scans] in kernels/common/triton_scan.py): the measurement behind SCAN_LAUNCH's pair_max_chunks.

One GPU, B=1, bf16 updates, ``triton.testing.do_bench`` per row::

    python3 benchmarks/scan_pairing.py --lengths 2048 4096 8192 16384 32768 65536
"""

from __future__ import annotations

import argparse

import torch

from schedlang.kernels.common.triton_scan import chunk_state_scan, chunk_state_scan_pair


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    arguments = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    import triton

    heads, dim = arguments.heads, arguments.head_dim
    print("| tokens | pair, no boundary | pair, both boundaries | two launches, no boundary | two launches, both |")
    print("|---|---|---|---|---|")
    for length in arguments.lengths:
        chunks = length // 64
        updates, grad_updates = ((torch.randn(1, heads, chunks, dim, dim, device="cuda") * 0.01).to(torch.bfloat16) for _ in range(2))
        gate = -torch.rand(1, heads, chunks, dim, device="cuda") * 0.2
        boundary = torch.randn(1, heads, dim, dim, device="cuda") * 0.1

        def paired(initial, final):
            chunk_state_scan_pair(updates, grad_updates, gate, initial, final, torch.bfloat16)

        def separate(initial, final):
            chunk_state_scan(updates, gate, initial, torch.bfloat16, reverse=False)
            chunk_state_scan(grad_updates, gate, final, torch.bfloat16, reverse=True)

        cells = [
            triton.testing.do_bench(lambda: run(*boundaries), warmup=25, rep=100) * 1e3
            for run in (paired, separate)
            for boundaries in ((None, None), (boundary, boundary))
        ]
        paired_none, paired_both, separate_none, separate_both = cells
        print(f"| {length} | {paired_none:.1f} us | {paired_both:.1f} | {separate_none:.1f} | {separate_both:.1f} |")


if __name__ == "__main__":
    main()
