"""Time schedlang's chunked GLA / simple-GLA kernels against flash-linear-attention in the same run.

    python benchmarks/kernels.py                      # issue 3 shapes: B=1, H=16, D=128, T=16K and 32K, bf16
    python benchmarks/kernels.py --chunk-calls        # issue 5: per-call times at T=2K/4K/8K with state in/out
    python benchmarks/kernels.py --json results.json

Needs a CUDA GPU. flash-linear-attention (fla-core 0.6.0) is optional: without it only our times print.
fla refuses its gated backward on Hopper with Triton < 3.7.1 (a correctness guard); for timing alone the
guard is lifted here, and the numbers of that backward are times, not results we rely on.
Each time is the median of triton.testing.do_bench (milliseconds). Floors: bytes each kernel must move
(inputs read once, outputs written once) over the copy bandwidth measured in this run, and the matrix
FLOPs of the chunked algorithm over the bf16 matrix rate measured in this run.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
import triton

from schedlang.kernels import chunk_gla, chunk_simple_gla

CHUNK = 64


def load_peer():
    try:
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gla import chunk_gla as fla_gla
        from fla.ops.simple_gla import chunk_simple_gla as fla_simple_gla
    except ImportError as error:
        print(f"flash-linear-attention not available ({error}); timing schedlang alone", file=sys.stderr)
        return None
    fla_chunk_o.TRITON_ABOVE_3_7_1 = True
    return {"gla": fla_gla, "simple_gla": fla_simple_gla}


def measure_ceilings() -> dict[str, float]:
    source = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    copy_ms = triton.testing.do_bench(lambda: target.copy_(source), warmup=50, rep=300, return_mode="median")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    matmul_ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    del source, target
    return {"bandwidth_bytes_per_s": 2 * 2 * 1024**3 / (copy_ms * 1e-3), "matmul_flops_per_s": 2 * 8192**3 / (matmul_ms * 1e-3)}


def make_inputs(operator: str, length: int, heads: int, dim: int, with_state: bool):
    def draw(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(True)

    gate_shape = (1, length, heads, dim) if operator == "gla" else (1, length, heads)
    gate = (F.logsigmoid(torch.randn(*gate_shape, device="cuda")) / 16).requires_grad_(True)
    state = draw(1, heads, dim, dim, dtype=torch.float32) if with_state else None
    return draw(1, length, heads, dim), draw(1, length, heads, dim), draw(1, length, heads, dim), gate, state


def floors(operator: str, length: int, heads: int, dim: int, ceilings: dict) -> dict[str, float]:
    tokens = length * heads
    gate_bytes = 4 * (dim if operator == "gla" else 1)
    forward_bytes = tokens * (3 * dim * 2 + gate_bytes + dim * 2)
    backward_bytes = tokens * (4 * dim * 2 + gate_bytes + 3 * dim * 2 + gate_bytes)
    n_chunks = triton.cdiv(length, CHUNK)
    per_chunk = 2 * CHUNK * CHUNK * dim * 2 + 2 * CHUNK * dim * dim * 2
    forward_flops = heads * n_chunks * per_chunk
    result = {}
    for name, n_bytes, flops in (("fwd", forward_bytes, forward_flops), ("fwdbwd", forward_bytes + backward_bytes, 3 * forward_flops)):
        result[name + "_bytes_floor_ms"] = n_bytes / ceilings["bandwidth_bytes_per_s"] * 1e3
        result[name + "_matmul_floor_ms"] = flops / ceilings["matmul_flops_per_s"] * 1e3
    return result


def time_operator(function, inputs, with_state: bool) -> dict[str, float]:
    q, k, v, g, state = inputs
    output_grad = torch.randn_like(v)

    def forward():
        with torch.no_grad():
            return function(q, k, v, g, initial_state=state, output_final_state=with_state)

    def forward_backward():
        output, final_state = function(q, k, v, g, initial_state=state, output_final_state=with_state)
        loss = (output * output_grad).sum()
        if final_state is not None:
            loss = loss + final_state.sum()
        loss.backward()

    return {
        "fwd_ms": triton.testing.do_bench(forward, warmup=100, rep=500, return_mode="median"),
        "fwdbwd_ms": triton.testing.do_bench(forward_backward, warmup=100, rep=500, grad_to_none=[q, k, v, g], return_mode="median"),
    }


def time_graph_replay(function, inputs, with_state: bool) -> float:
    """Forward + backward captured once in a CUDA graph, then replayed (issue 5)."""
    q, k, v, g, state = inputs
    leaves = [tensor for tensor in (q, k, v, g, state) if tensor is not None]
    output_grad = torch.randn_like(v)

    def step():
        output, final_state = function(q, k, v, g, initial_state=state, output_final_state=with_state)
        loss = (output * output_grad).sum() + (final_state.sum() if final_state is not None else 0)
        return torch.autograd.grad(loss, leaves)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return triton.testing.do_bench(graph.replay, warmup=100, rep=500, return_mode="median")


def agreement(ours, peer, inputs, with_state: bool) -> float:
    q, k, v, g, state = inputs
    with torch.no_grad():
        mine, _ = ours(q, k, v, g, initial_state=state, output_final_state=with_state)
        theirs, _ = peer(q, k, v, g, initial_state=state, output_final_state=with_state)
    return ((mine.float() - theirs.float()).norm() / theirs.float().norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--chunk-calls", action="store_true", help="issue 5: T=2K/4K/8K with state in/out, graph replay")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    peer = load_peer()
    ceilings = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"# measured: copy {ceilings['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ceilings['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s")
    lengths = [2048, 4096, 8192, 32768] if args.chunk_calls else args.lengths
    ours = {"gla": chunk_gla, "simple_gla": chunk_simple_gla}
    rows = []
    for operator in ("gla", "simple_gla"):
        for length in lengths:
            with_state = args.chunk_calls
            inputs = make_inputs(operator, length, args.heads, args.dim, with_state)
            row = {"operator": operator, "T": length, "state_in_out": with_state}
            row.update({"ours_" + key: value for key, value in time_operator(ours[operator], inputs, with_state).items()})
            row.update(floors(operator, length, args.heads, args.dim, ceilings))
            if args.chunk_calls:
                row["ours_graph_fwdbwd_ms"] = time_graph_replay(ours[operator], inputs, with_state)
            if peer is not None:
                row.update({"fla_" + key: value for key, value in time_operator(peer[operator], inputs, with_state).items()})
                row["output_rel_diff_vs_fla"] = agreement(ours[operator], peer[operator], inputs, with_state)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    header = "| op | T | ours fwd | fla fwd | ratio | ours fwd+bwd | fla fwd+bwd | ratio | fwd+bwd floor (bytes / matmul) | graph fwd+bwd | ns/token fwd+bwd |"
    print(header)
    print("|---" * 11 + "|")
    for row in rows:
        fla_fwd = row.get("fla_fwd_ms", float("nan"))
        fla_fb = row.get("fla_fwdbwd_ms", float("nan"))
        graph = row.get("ours_graph_fwdbwd_ms", float("nan"))
        tokens = row["T"]
        print(
            f"| {row['operator']} | {row['T']} | {row['ours_fwd_ms']:.3f} | {fla_fwd:.3f} | {row['ours_fwd_ms'] / fla_fwd:.2f} "
            f"| {row['ours_fwdbwd_ms']:.3f} | {fla_fb:.3f} | {row['ours_fwdbwd_ms'] / fla_fb:.2f} "
            f"| {row['fwdbwd_bytes_floor_ms']:.3f} / {row['fwdbwd_matmul_floor_ms']:.3f} | {graph:.3f} "
            f"| {row['ours_fwdbwd_ms'] * 1e6 / tokens:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"ceilings": ceilings, "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
