"""Packed documents: one operator call per chunk (the fused padded layout) against one call per document piece.

    python benchmarks/packed_documents.py                        # gla and gdn, Triton, bf16, B=1 H=16 D=128,
                                                                 # one 32K chunk, documents of 256 .. 16384 tokens
    python benchmarks/packed_documents.py --device cpu --tiny    # the whole path on a CPU in seconds (no timings
                                                                 # worth reading: the PyTorch kernels, tiny shapes)

The chunk is positions T .. 2T - 1 of a sequence whose documents start every ``document length`` tokens, the
first half a document after the chunk's start, so the chunk's first piece continues the previous chunk's
document (it reads the initial state) and its last piece runs on into the next chunk. Each row of the table
times the forward+backward (torch.autograd.grad of the output and the final state, for random gradients of
both) of :func:`schedlang.runtime.packing.recurrent_piece_by_piece` (one call per piece) and of
:func:`schedlang.runtime.packing.recurrent_by_document` (one call over the padded rows, [Note: packed documents]):
the median of ``--repeats`` runs after ``--warmup`` untimed ones, CUDA events on a GPU. ``pad tokens``: the
zero pads and reset tokens the fused call adds to the chunk; ``layout ms``: building the padded layout's index
on the host and copying it to the device, once per chunk (every layer of the chunk reuses it); ``max rel diff``:
the largest relative difference (in norm) between the two calls' outputs, final states and gradients.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median_ms  # noqa: E402
from benchmarks.kernels import make_inputs  # noqa: E402
from schedlang.kernels import CHUNK_SIZE, chunk_gated_delta_rule, chunk_gla  # noqa: E402
from schedlang.runtime.mixer_base import kernel_backend  # noqa: E402
from schedlang.runtime.packing import (  # noqa: E402
    ChunkDocuments,
    PaddedRows,
    padded_index,
    recurrent_by_document,
    recurrent_piece_by_piece,
)

OPERATORS = {"gla": chunk_gla, "gdn": chunk_gated_delta_rule}
LOG_GATE = 3
"""Where the log-gate sits among each operator's per-token tensors (q, k, v, g[, beta]), as the mixers pass it."""


def chunk_documents(length: int, document_length: int) -> ChunkDocuments:
    """Positions ``length .. 2 length - 1`` of one row whose documents start at ``length + document_length // 2``
    and every ``document_length`` tokens before and after it."""
    first = length + document_length // 2
    inner = tuple(range(first, 2 * length, document_length))
    return ChunkDocuments(length, 2 * length, (first - document_length,), (inner,))


def forward_backward(by_pieces, operator, documents: ChunkDocuments, inputs):
    """A closure running one forward+backward of ``operator`` over ``documents`` (piece by piece or fused),
    returning the output, the final state and the gradients of every input."""
    *per_token, state = inputs
    generator = torch.Generator(device=state.device).manual_seed(1)
    output_grad = torch.randn(per_token[2].shape, generator=generator, device=state.device).to(per_token[2].dtype)
    state_grad = torch.randn(state.shape, generator=generator, device=state.device)

    def step():
        if by_pieces:
            output, final_state = recurrent_piece_by_piece(documents, state, operator, *per_token)
        else:
            output, final_state = recurrent_by_document(documents, state, operator, *per_token, log_gate=LOG_GATE)
        gradients = torch.autograd.grad((output, final_state), inputs, (output_grad, state_grad))
        return (output, final_state, *gradients)

    return step


def relative_difference(first, second) -> float:
    return max(
        float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm().clamp_min(1e-30))
        for a, b in zip(first, second)
    )


def measure(name: str, length: int, document_length: int, args, device: torch.device) -> dict:
    function = OPERATORS[name]
    backend = kernel_backend(device)

    def operator(state, *per_token):
        return function(*per_token, initial_state=state, output_final_state=True, backend=backend)

    torch.manual_seed(0)
    inputs = make_inputs(name, length, args.heads, args.dim, True, device=str(device))
    documents = chunk_documents(length, document_length)
    pieces_step = forward_backward(True, operator, documents, inputs)
    fused_step = forward_backward(False, operator, documents, inputs)

    def build_layout():
        return padded_index.__wrapped__(documents, CHUNK_SIZE, device)

    return {
        "operator": name,
        "document_length": document_length,
        "pieces": sum(len(documents.pieces(row)) for row in range(documents.rows)),
        "pad_tokens": PaddedRows.of(documents, CHUNK_SIZE).length - length,
        "pieces_ms": median_ms(pieces_step, args.warmup, args.repeats, device),
        "fused_ms": median_ms(fused_step, args.warmup, args.repeats, device),
        "layout_ms": median_ms(build_layout, args.warmup, args.repeats, device),
        "difference": relative_difference(fused_step(), pieces_step()),
    }


def table(rows: list[dict], length: int) -> str:
    lines = [
        "| operator | document length | pieces | pad tokens | piece-by-piece ms | fused ms | speedup | layout ms "
        "| max rel diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['operator']} | {row['document_length']} | {row['pieces']} | "
            f"{row['pad_tokens']} ({100 * row['pad_tokens'] / length:.1f}%) | {row['pieces_ms']:.2f} | "
            f"{row['fused_ms']:.2f} | {row['pieces_ms'] / row['fused_ms']:.2f}x | {row['layout_ms']:.3f} | "
            f"{row['difference']:.1e} |"
        )
    return "\n".join(lines)


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the Triton kernels) or cpu (the PyTorch kernels)")
    parser.add_argument("--tiny", action="store_true", help="T=128, H=2, D=16, documents of 16 and 64 tokens")
    parser.add_argument("--operators", nargs="+", choices=sorted(OPERATORS), default=["gla", "gdn"])
    parser.add_argument("--length", type=int, default=32768, help="tokens of the chunk (T)")
    parser.add_argument("--document-lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128, help="key and value width per head")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if args.tiny:
        args.length, args.document_lengths, args.heads, args.dim = 128, [16, 64], 2, 16
        args.warmup, args.repeats = 1, 2
    return args


def main(argv=None) -> None:
    args = parse_arguments(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu --tiny")
    rows = [
        measure(name, args.length, document_length, args, device)
        for name in args.operators
        for document_length in args.document_lengths
    ]
    print(f"B=1 H={args.heads} D={args.dim} T={args.length} bf16, {kernel_backend(device)} kernels, forward+backward")
    print(table(rows, args.length))


if __name__ == "__main__":
    main()
