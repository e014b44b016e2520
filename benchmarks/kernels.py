"""Time schedlang's chunked GLA / simple-GLA kernels (and the gated delta rule) against flash-linear-attention.

    python benchmarks/kernels.py                      # issue 3 shapes: B=1, H=16, D=128, T=16K and 32K, bf16
    python benchmarks/kernels.py --chunk-lengths 2048 4096 8192 32768   # issue 5: calls with state in/out
    python benchmarks/kernels.py --chunk-lengths 4096 --save-states      # also with the forward's states kept
    python benchmarks/kernels.py --json results.json
    python benchmarks/kernels.py --peer-only          # fla alone: its autotuning results are cached on disk, so a
                                                      # later run (another GPU of the machine too) skips them
    python benchmarks/kernels.py --cpu-torch-path     # the runtime's CPU path: T=4096, H=2, D=64, float32
    python benchmarks/kernels.py --operators gdn --lengths 8192 --chunk-lengths 4096   # Gated DeltaNet (our
                                                      # Triton WY kernels) against fla's Triton kernels

Needs a CUDA GPU. flash-linear-attention (fla-core 0.6.0) is optional: without it only our times print.
fla refuses its gated backward on Hopper with Triton < 3.7.1 (a correctness guard); for timing alone the
guard is lifted here, and the numbers of that backward are times, not results we rely on.
Each time is the median of triton.testing.do_bench (milliseconds); forward+backward is the operator's forward and
its backward for given output (and final-state) gradients, through torch.autograd.grad: no loss, no .grad writes. Floors: bytes each kernel must move
(inputs read once, outputs written once) over the copy bandwidth measured in this run, and the matrix
FLOPs of the chunked algorithm over the bf16 matrix rate measured in this run.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import time

from pathlib import Path

import torch
import torch.nn.functional as F
import triton

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import capture_graph  # noqa: E402
from benchmarks.installed import import_installed  # noqa: E402
from schedlang.kernels import chunk_gla, chunk_simple_gla  # noqa: E402
from schedlang.kernels.common.launch_tables import launch_overrides  # noqa: E402
from schedlang.kernels.gdn import chunk_gated_delta_rule  # noqa: E402

CHUNK = 64
OURS = {"gla": chunk_gla, "simple_gla": chunk_simple_gla, "gdn": chunk_gated_delta_rule}
"""Each operator is called as ``function(*operands, initial_state=..., output_final_state=...)``, with the operands
that make_inputs draws for it: (q, k, v, g), and for gdn (q, k, v, g, beta)."""


TRITON_KERNEL_MODULES = (
    "schedlang.kernels.common.triton_scan",
    "schedlang.kernels.gla.chunk_triton",
    "schedlang.kernels.simple_gla.chunk_triton",
    "schedlang.kernels.gdn.state_pass_triton",
)
"""The modules that register a launch table (the operators import them at their first Triton call)."""


def import_launch_tables() -> None:
    """Import every module of TRITON_KERNEL_MODULES, so that each launch table is registered."""
    for name in TRITON_KERNEL_MODULES:
        importlib.import_module(name)


def load_peer():
    try:
        import_installed("fla")  # benchmarks/installed.py: the checkout's own `kernels` off sys.path
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
        from fla.ops.gla import chunk_gla as fla_gla
        from fla.ops.simple_gla import chunk_simple_gla as fla_simple_gla
    except ImportError as error:
        print(f"flash-linear-attention not available ({error}); timing schedlang alone", file=sys.stderr)
        return None
    fla_chunk_o.TRITON_ABOVE_3_7_1 = True
    return {"gla": fla_gla, "simple_gla": fla_simple_gla, "gdn": fla_gdn}


def measure_ceilings() -> dict[str, float]:
    source = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    copy_ms = triton.testing.do_bench(lambda: target.copy_(source), warmup=50, rep=300, return_mode="median")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    matmul_ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    del source, target
    return {"bandwidth_bytes_per_s": 2 * 2 * 1024**3 / (copy_ms * 1e-3), "matmul_flops_per_s": 2 * 8192**3 / (matmul_ms * 1e-3)}


def make_inputs(operator: str, length: int, heads: int, dim: int, with_state: bool, device: str = "cuda"):
    """(*operands, initial state or None), leaves that require grad; gdn's keys are unit-norm per head and its
    write strengths beta lie in (0, 1), as Gated DeltaNet's layer makes them."""

    def draw(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(True)

    gate_shape = (1, length, heads, dim) if operator == "gla" else (1, length, heads)
    gate = (F.logsigmoid(torch.randn(*gate_shape, device=device)) / 16).requires_grad_(True)
    state = draw(1, heads, dim, dim, dtype=torch.float32) if with_state else None
    q, k, v = draw(1, length, heads, dim), draw(1, length, heads, dim), draw(1, length, heads, dim)
    if operator != "gdn":
        return q, k, v, gate, state
    k = F.normalize(k.detach().float(), dim=-1).to(k.dtype).requires_grad_(True)
    beta = torch.sigmoid(torch.randn(1, length, heads, device=device)).to(q.dtype).requires_grad_(True)
    return q, k, v, gate, beta, state


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


def gradient_step(function, inputs, with_state: bool):
    """A closure running one forward+backward: the gradients of q, k, v, g (and the initial state) for a random
    output gradient (and a random final-state gradient), through torch.autograd.grad, so no loss kernels and
    no accumulation into .grad are timed, as a layer inside a model sees the operator."""
    *operands, state = inputs
    leaves = [tensor for tensor in inputs if tensor is not None]
    output_grad = torch.randn_like(operands[2])
    state_grad = torch.randn_like(state) if with_state else None

    def step():
        output, final_state = function(*operands, initial_state=state, output_final_state=with_state)
        outputs, grads = [output], [output_grad]
        if with_state:
            outputs.append(final_state)
            grads.append(state_grad)
        return torch.autograd.grad(outputs, leaves, grads)

    return step


def time_operator(function, inputs, with_state: bool) -> dict[str, float]:
    *operands, state = inputs

    def forward():
        with torch.no_grad():
            return function(*operands, initial_state=state, output_final_state=with_state)

    return {
        "fwd_ms": triton.testing.do_bench(forward, warmup=50, rep=200, return_mode="median"),
        "fwdbwd_ms": triton.testing.do_bench(gradient_step(function, inputs, with_state), warmup=50, rep=200, return_mode="median"),
    }


def time_graph_replay(function, inputs, with_state: bool) -> tuple[float, float]:
    """Forward + backward captured once in a CUDA graph, then replayed (issue 5).

    Returns (median replay time in ms, largest relative difference of the replayed gradients from an
    eager step on the same inputs).
    """
    step = gradient_step(function, inputs, with_state)
    eager = step()
    graph, captured = capture_graph(step)
    difference = max(
        ((replayed.float() - reference.float()).norm() / reference.float().norm()).item()
        for replayed, reference in zip(captured, eager)
    )
    return triton.testing.do_bench(graph.replay, warmup=50, rep=200, return_mode="median"), difference


def agreement(ours, peer, inputs, with_state: bool) -> float:
    *operands, state = inputs
    with torch.no_grad():
        mine, _ = ours(*operands, initial_state=state, output_final_state=with_state)
        theirs, _ = peer(*operands, initial_state=state, output_final_state=with_state)
    return ((mine.float() - theirs.float()).norm() / theirs.float().norm()).item()


def kernel_breakdown(function, inputs, with_state: bool) -> list[tuple[str, float]]:
    """CUDA time per kernel name (ms per forward+backward), from torch.profiler over 10 steps."""
    step = gradient_step(function, inputs, with_state)
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    totals = {}
    for event in profiler.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.key] = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0)) / 1e3 / 10
    return sorted(totals.items(), key=lambda item: -item[1])


def print_table(rows: list[dict]) -> None:
    """The markdown table; per token is of the graph replay where there is one (issue 5's chunk calls), and
    "vs longest" divides it by the per-token time of the same operator's longest call with state in/out."""
    header = (
        "| op | T | state in/out | ours fwd | fla fwd | ratio | ours fwd+bwd | fla fwd+bwd | ratio "
        "| fwd+bwd floor bytes / matmul | graph replay fwd+bwd | same, save_states | ns/token fwd+bwd | vs longest |"
    )
    print(header)
    print("|---" * 14 + "|")
    nan = float("nan")

    def per_token(row):
        return row.get("ours_graph_fwdbwd_ms", row["ours_fwdbwd_ms"]) * 1e6 / row["T"]

    longest = {}
    for row in rows:
        if row["state_in_out"] and row["T"] > longest.get(row["operator"], {"T": 0})["T"]:
            longest[row["operator"]] = row
    for row in rows:
        fla_fwd, fla_fb = row.get("fla_fwd_ms", nan), row.get("fla_fwdbwd_ms", nan)
        reference = longest.get(row["operator"]) if row["state_in_out"] else None
        versus = per_token(row) / per_token(reference) if reference else nan
        print(
            f"| {row['operator']} | {row['T']} | {row['state_in_out']} | {row['ours_fwd_ms']:.3f} | {fla_fwd:.3f} "
            f"| {row['ours_fwd_ms'] / fla_fwd:.2f} | {row['ours_fwdbwd_ms']:.3f} | {fla_fb:.3f} "
            f"| {row['ours_fwdbwd_ms'] / fla_fb:.2f} | {row.get('fwdbwd_bytes_floor_ms', nan):.3f} / {row.get('fwdbwd_matmul_floor_ms', nan):.3f} "
            f"| {row.get('ours_graph_fwdbwd_ms', nan):.3f} | {row.get('ours_saved_graph_fwdbwd_ms', nan):.3f} "
            f"| {per_token(row):.1f} | {versus:.2f} |"
        )


def time_cpu_torch_path(length: int = 4096, heads: int = 2, dim: int = 64, repeats: int = 3) -> None:
    """Median wall time of the pure-PyTorch path (backend="torch") on the CPU, forward and forward+backward."""
    for name, function in (("gla", chunk_gla), ("simple_gla", chunk_simple_gla)):
        gate_shape = (1, length, heads, dim) if name == "gla" else (1, length, heads)
        q, k, v = (torch.randn(1, length, heads, dim, requires_grad=True) for _ in range(3))
        g = (F.logsigmoid(torch.randn(*gate_shape)) / 16).requires_grad_(True)
        state = torch.randn(1, heads, dim, dim, requires_grad=True)
        forward_times, step_times = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            with torch.no_grad():
                function(q, k, v, g, initial_state=state, output_final_state=True, backend="torch")
            forward_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            output, final_state = function(q, k, v, g, initial_state=state, output_final_state=True, backend="torch")
            (output.sum() + final_state.sum()).backward()
            step_times.append(time.perf_counter() - started)
        print(
            f"| {name} | {length} | {heads} | {dim} | {sorted(forward_times)[repeats // 2] * 1e3:.0f} "
            f"| {sorted(step_times)[repeats // 2] * 1e3:.0f} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768], help="one call per sequence, no state")
    parser.add_argument("--chunk-lengths", type=int, nargs="*", default=[], help="issue 5: calls with state in/out, plus graph replay")
    parser.add_argument(
        "--operators", nargs="+", choices=sorted(OURS), default=["gla", "simple_gla"],
        help="gdn: our chunked gated delta rule (Triton WY kernels) against fla's; benchmarks/gdn_kernels.py has more",
    )
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--breakdown", action="store_true",
        help="per-kernel CUDA times at the first --chunk-lengths value (state in/out), else the first --lengths value",
    )
    parser.add_argument(
        "--save-states", action="store_true",
        help="also time the state in/out calls with save_states=True (the backward takes the forward's states)",
    )
    parser.add_argument("--peer-deadline", type=float, default=1e9, help="seconds after start past which fla is skipped")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--cpu-torch-path", action="store_true", help="time the pure-PyTorch path on the CPU and stop")
    parser.add_argument("--peer-only", action="store_true", help="time fla alone (fills its autotuning cache)")
    parser.add_argument(
        "--launch-table", help="launch-table overrides to time with, {table: {entry: {knob: value}}} "
        "(benchmarks/tune_kernels.py --out; kernels/common/launch_tables.py)"
    )
    args = parser.parse_args()
    overrides = {}
    import_launch_tables()
    if args.launch_table:
        with open(args.launch_table) as handle:
            overrides = json.load(handle)
    with launch_overrides(overrides):
        return run(args)


def run(args: argparse.Namespace) -> int:
    if args.cpu_torch_path:
        print(f"# CPU, {torch.get_num_threads()} threads, torch {torch.__version__}")
        print("| op | T | H | D | fwd (ms) | fwd+bwd (ms) |")
        print("|---|---|---|---|---|---|")
        time_cpu_torch_path()
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.monotonic()
    peer = load_peer()
    ceilings = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"# measured: copy {ceilings['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ceilings['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s")
    ours = OURS
    configurations = [(length, False) for length in args.lengths] + [(length, True) for length in args.chunk_lengths]
    rows, breakdowns = [], {}
    for operator in args.operators:
        for length, with_state in configurations:
            row = {"operator": operator, "T": length, "state_in_out": with_state}
            if args.peer_only:
                rows.append(row)
                continue
            inputs = make_inputs(operator, length, args.heads, args.dim, with_state)
            row.update({"ours_" + key: value for key, value in time_operator(ours[operator], inputs, with_state).items()})
            if operator != "gdn":  # the floors count GLA's chunked FLOPs and bytes
                row.update(floors(operator, length, args.heads, args.dim, ceilings))
            if with_state:
                try:
                    replay_ms, replay_difference = time_graph_replay(ours[operator], inputs, with_state)
                    row["ours_graph_fwdbwd_ms"] = replay_ms
                    row["graph_replay_rel_diff_vs_eager"] = replay_difference
                    if args.save_states and operator != "gdn":
                        saving = functools.partial(ours[operator], save_states=True)
                        row["ours_saved_graph_fwdbwd_ms"], _ = time_graph_replay(saving, inputs, with_state)
                        row["ours_saved_fwdbwd_ms"] = time_operator(saving, inputs, with_state)["fwdbwd_ms"]
                except Exception as error:  # a capture failure is a result to report, not a reason to stop
                    row["graph_error"] = repr(error)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.breakdown and not args.peer_only:
            length, with_state = (args.chunk_lengths[0], True) if args.chunk_lengths else (args.lengths[0], False)
            inputs = make_inputs(operator, length, args.heads, args.dim, with_state)
            try:
                breakdowns[operator] = kernel_breakdown(ours[operator], inputs, with_state)
            except Exception as error:
                print(f"# breakdown failed: {error!r}"[:300])
                breakdowns[operator] = []
            print(f"# {operator} T={length}{' state in/out' if with_state else ''} fwd+bwd per kernel (ms):")
            for name, milliseconds in breakdowns[operator][:14]:
                print(f"#   {milliseconds:8.3f}  {name[:90]}")
    if peer is not None:
        # the headline rows first (longest-first autotuning of fla can eat the deadline)
        def priority(row):
            headline = (not row["state_in_out"] and row["T"] == args.lengths[0]) or (row["state_in_out"] and row["T"] == 4096)
            return (not headline, row["state_in_out"], row["T"])

        for row in sorted(rows, key=priority):
            if time.monotonic() - started > args.peer_deadline:
                print("# peer deadline reached; remaining fla timings skipped", flush=True)
                break
            operator, with_state = row["operator"], row["state_in_out"]
            inputs = make_inputs(operator, row["T"], args.heads, args.dim, with_state)
            try:
                row.update({"fla_" + key: value for key, value in time_operator(peer[operator], inputs, with_state).items()})
                row["output_rel_diff_vs_fla"] = agreement(ours[operator], peer[operator], inputs, with_state)
            except Exception as error:
                row["fla_error"] = repr(error)[:300]
            print(json.dumps(row), flush=True)
    print()
    if not args.peer_only:
        print_table(rows)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"ceilings": ceilings, "rows": rows, "breakdowns": breakdowns}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
