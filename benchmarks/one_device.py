"""The longest sequence ONE GPU trains: schedlang's Trainer against torch and flash-linear-attention.

The model is the pipeline benchmark's 1B-class GLA model on ``mesh { pipeline = 1 }``, one sequence per step,
bf16 (fp32 on the CPU): the schedule file ``--schedule`` (benchmarks/schedules/gla_1b_one_device.sched), whose
``model`` every system trains. The systems:

- ``torch``: the runtime's own modules (``build_stage_model`` for the whole stack), the full sequence in one
  forward, backward and AdamW step, the loss in float32 over the whole sequence's logits (the pipeline
  benchmark's peer without the pipeline);
- ``torch+ckpt``: the same with torch's activation checkpointing on every block (non-reentrant
  ``checkpoint_wrapper``, as the pipeline benchmark's peer applies it);
- ``fla``: flash-linear-attention's ``GLAForCausalLM`` with the widths of the same model
  (``schedlang.runtime.hf_format.fla_peer_config`` says what differs), ``fuse_cross_entropy`` on, its default
  kernels; only where ``import fla`` works and on a GPU, otherwise reported as skipped;
- ``schedlang:<key>=<value>/...``: schedlang's Trainer on a one-device mesh, the file revised on those keys
  (benchmarks/pipeline_schedule.py: ``schedlang:chunks=16/recompute=full``,
  ``schedlang:chunks=16/recompute=mlp/offload=true``); each system's schedule is written under ``--out``.

``--schedule benchmarks/schedules/mamba2_1b_one_device.sched`` runs the same systems on the same model with
``mamba2`` mixing layers (state size 128), for the longest mamba2 sequence beside GLA's (``fla`` is GLA's peer
and so left out there).

On a GPU the Triton kernels must pass a preflight (a GLA call checked against the PyTorch path) first, or the
benchmark stops; ``--allow-torch-kernels`` measures the PyTorch kernels instead, on purpose.

Three phases. Throughput: each of ``--systems`` at ``--length`` in its own process, ``--warmup`` steps then
the median of ``--steps`` timed steps, and the job's peak allocated and reserved memory (the whole job: build,
warm-up and timed steps). Length search: each of ``--search-systems``, the longest length that trains
(``benchmarks.common.longest_fitting_length``: from ``--search-start``, doubling, then bisection in
``--search-step`` steps up to ``--search-max``), each length in a fresh process (an out-of-memory leaves
nothing behind) that runs one step after ``--search-warmup`` steps (1 makes the timed step a steady one, with
AdamW's state live, at the price of a step per attempt); tokens/s at the longest come from that step. An
out-of-memory is "does not fit"; any other failure, or a timeout, stops that system's search. ``--budget``
seconds cover the whole search, shared fairly: a system starts attempts until its share (what is left over
the systems still to search) is spent, and an attempt started runs at most ``--search-timeout`` seconds and
not past the budget's end (a few seconds' grace), so the search keeps to ``--budget``.
Prediction: for each schedlang system, what ``schedlang simulate --fit`` proposes for its schedule on a
device of the GPU's memory (length, chunk count, reserved peak, tokens/s), beside the measured longest length
with its reserved peak and the memory model's peak there; ``--fit`` runs on the CPU beside the search.

One H200 (about 8 minutes, the defaults):
    python benchmarks/one_device.py --out results/one-device
A tiny CPU run of the whole path:
    python benchmarks/one_device.py --device cpu --tiny --out /tmp/one-device --length 256 \\
        --systems torch schedlang:chunks=2/recompute=full --search-systems schedlang:chunks=2/recompute=full \\
        --search-start 128 --search-step 128 --search-max 512
The mamba2 model:
    python benchmarks/one_device.py --schedule benchmarks/schedules/mamba2_1b_one_device.sched \\
        --systems torch schedlang:chunks=16 --search-systems schedlang:chunks=16/recompute=full --out results/mamba2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch
import torch.distributed as dist

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schedlang.lowering.cost import model_training_flops_per_token  # noqa: E402
from schedlang.runtime.step_graphs import steps_before_steady  # noqa: E402

from benchmarks.common import (  # noqa: E402
    gib,
    longest_fitting_length,
    median_ms,
    peak_memory,
    peak_reserved,
    release,
    reset_peak,
    synchronize,
)
from benchmarks.installed import CHECKOUT  # noqa: E402
from benchmarks.one_device_systems import (  # noqa: E402
    FLA_SYSTEM,
    build_system,
    configs_of,
)
from benchmarks.pipeline_schedule import (  # noqa: E402
    ONE_DEVICE_SCHEDULE,
    BenchmarkSchedule,
    base_program,
    is_schedlang_system,
    predicted_reserved_bytes,
    system_file_name,
    system_program,
    variant_program,
)
from benchmarks.training_systems import (  # noqa: E402
    error_lines,
    kernel_preflight,
    preflight,
    run_job,
    train_dtype,
)

DEFAULT_SYSTEMS = ["torch", "torch+ckpt", "schedlang:chunks=16", "schedlang:chunks=16/recompute=full", FLA_SYSTEM]
DEFAULT_SEARCH_SYSTEMS = ["schedlang:chunks=16/recompute=full", "torch+ckpt", FLA_SYSTEM]
"""fla last in both phases: its first call autotunes its kernels (minutes on a fresh machine), so a system
after it would get less of the time; in the search it inherits what the others left of ``--budget``."""


class Outcome(str, Enum):
    """How one measurement job ended."""

    MEASURED = "measured"
    OUT_OF_MEMORY = "out of memory"
    TIMED_OUT = "timed out"
    FAILED = "failed"
    SKIPPED = "skipped"


OUT_OF_MEMORY_MARKERS = (
    "OutOfMemoryError", "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "DefaultCPUAllocator: can't allocate memory"
)
"""What a job prints when the device (or, for offloaded activations, the host) ran out of memory."""


def job_outcome(code: int, output: str) -> Outcome:
    """A job's exit code and output as an outcome: 0 measured, 124 (``run_job``'s timeout) timed out, an
    allocation failure out of memory, anything else failed."""
    if code == 0:
        return Outcome.MEASURED
    if code == 124:
        return Outcome.TIMED_OUT
    if any(marker in output for marker in OUT_OF_MEMORY_MARKERS):
        return Outcome.OUT_OF_MEMORY
    return Outcome.FAILED


def measure(
    name: str, schedule: BenchmarkSchedule, length: int, warmup: int, steps: int, device: torch.device
) -> dict:
    """One system's record: the median of ``steps`` timed steps after ``warmup``, the job's peaks."""
    release(device)
    reset_peak(device)
    started = time.perf_counter()
    system = build_system(name, schedule, length, device)
    graphs = variant_program(schedule, name).pipeline.cuda_graphs if is_schedlang_system(name) else None
    if graphs is not None:
        warmup = max(warmup, steps_before_steady(graphs))
    for _ in range(warmup):
        system.step()
    synchronize(device)
    setup_seconds = time.perf_counter() - started
    step_seconds = []
    for _ in range(steps):
        begun = time.perf_counter()
        system.step()
        synchronize(device)
        step_seconds.append(time.perf_counter() - begun)
    median = statistics.median(step_seconds)
    record = {
        "system": name,
        "length": length,
        "tokens_per_second": length / median,
        "step_seconds": median,
        "each_step_seconds": step_seconds,
        "peak_bytes": peak_memory(device),
        "peak_reserved_bytes": peak_reserved(device),
        "model_state_bytes": system.model_state_bytes(),
        "setup_seconds": setup_seconds,
        "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0,
    }
    system.close()
    return record


GEMM_SYSTEM = "gemm"
"""The throughput phase's first job: the device's rate on one large GEMM in the training dtype, which each system's
model-FLOP rate is read against (issue 37's goal: the whole-sequence step at 70% of it)."""

GEMM_SIZES = {"cuda": 8192, "cpu": 1024}
"""The square GEMM's side: 8192 in bf16 on a GPU (long enough to run at the GEMM units' sustained rate), 1024 on
the CPU."""


def gemm_record(device: torch.device) -> dict:
    """FLOP/s of ``C = A B`` with square operands of :data:`GEMM_SIZES` in the training dtype: the median of 20
    products after 5 (benchmarks.common.median_ms)."""
    size = GEMM_SIZES[device.type]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    c = torch.empty(size, size, device=device, dtype=dtype)
    milliseconds = median_ms(lambda: torch.mm(a, b, out=c), 5, 20, device)
    return {"system": GEMM_SYSTEM, "size": size, "dtype": str(dtype).removeprefix("torch."),
            "flops_per_second": 2 * size**3 / (milliseconds / 1e3)}


def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.system == GEMM_SYSTEM:
        record = gemm_record(device)
    else:
        record = measure(args.system, benchmark_schedule(args), args.length, args.warmup, args.steps, device)
    print(json.dumps([record]), flush=True)
    if args.result:
        Path(args.result).write_text(json.dumps([record], indent=1), encoding="utf-8")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


@dataclass(frozen=True)
class Attempt:
    """One job: a system at a length, how it ended, its record when measured, the error lines otherwise."""

    system: str
    length: int
    outcome: Outcome
    record: dict | None = None
    detail: str = ""

    def as_json(self) -> dict:
        return {"system": self.system, "length": self.length, "outcome": self.outcome.value, "record": self.record,
                "detail": self.detail}


def run_attempt(args, name: str, length: int, warmup: int, steps: int, timeout: float, skip: str | None) -> Attempt:
    """``name`` at ``length`` in a fresh process (nothing an out-of-memory leaves behind reaches the next)."""
    if skip is not None:
        return Attempt(name, length, Outcome.SKIPPED, detail=skip)
    result = Path(args.out) / "attempt.json"
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--system", name, "--device", args.device,
        "--length", str(length), "--warmup", str(warmup), "--steps", str(steps), "--result", str(result),
        "--schedule", str(args.schedule),
    ] + (["--tiny"] if args.tiny else [])
    # Triton's autotuning results on disk: fla's kernels tune at their first call (minutes), and every length
    # of the search is a fresh process that would tune them again; schedlang's kernels do not autotune
    environment = {"TRITON_CACHE_AUTOTUNING": "1", **os.environ}
    code, records, output = run_job(command, environment, timeout, result)
    outcome = job_outcome(code, output)
    if outcome is Outcome.MEASURED and records:
        return Attempt(name, length, outcome, records[0])
    return Attempt(name, length, Outcome.FAILED if outcome is Outcome.MEASURED else outcome, detail=error_lines(output, 600))


def fla_skip_reason(device: str) -> str | None:
    """Why the fla system cannot run here (None: it can). ``import fla`` is tried in a subprocess, so that the
    driver never holds a CUDA context, from the installed packages (benchmarks/installed.py)."""
    if device != "cuda":
        return "fla's kernels need a GPU"
    probe = "from benchmarks.installed import import_installed; import_installed('fla')"
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                               cwd=CHECKOUT)
    if completed.returncode != 0:
        return "not installed (import fla: " + (completed.stderr.strip().splitlines() or ["failed"])[-1] + ")"
    return None


LAST_ATTEMPT_GRACE = 10.0
"""Seconds an attempt of the length search may run past the end of ``--budget``."""


class SearchStopped(Exception):
    """A system's search ends before it converged: its share of the budget is spent, or a job did not run."""


def search_longest(
    attempt_at, start: int, step: int, maximum: int, deadline: float
) -> tuple[Attempt | None, list[Attempt], str]:
    """The longest length that trains (its attempt), every attempt, and how the search ended.

    ``attempt_at(length)`` runs one attempt. A length trains when its attempt measured; out of memory is the
    search's "does not fit"; any other outcome (a timeout, a failure), or ``time.monotonic()`` past
    ``deadline`` before an attempt, stops the search at the longest length that trained so far.
    """
    attempts: list[Attempt] = []

    def trains_at(length: int) -> bool:
        if time.monotonic() >= deadline:
            raise SearchStopped("its share of --budget was spent")
        attempt = attempt_at(length)
        attempts.append(attempt)
        if attempt.outcome in (Outcome.MEASURED, Outcome.OUT_OF_MEMORY):
            return attempt.outcome is Outcome.MEASURED
        raise SearchStopped(f"{attempt.outcome.value} at {length}")

    ending = "converged"
    try:
        longest = longest_fitting_length(trains_at, start, step, maximum)
    except SearchStopped as stop:
        ending = f"stopped: {stop}"
        longest = max((attempt.length for attempt in attempts if attempt.outcome is Outcome.MEASURED), default=None)
    best = next((attempt for attempt in attempts if attempt.length == longest and attempt.record), None)
    return best, attempts, ending


def search_attempt(args, name: str, length: int, search_end: float) -> Attempt:
    """One attempt of the length search (``--search-warmup`` steps, one timed), printed as it ends. It may run
    ``--search-timeout`` seconds, but not past ``search_end`` (the end of ``--budget``) by more than
    :data:`LAST_ATTEMPT_GRACE`: the whole search keeps to its budget."""
    timeout = min(args.search_timeout, max(search_end - time.monotonic(), 0.0) + LAST_ATTEMPT_GRACE)
    attempt = run_attempt(args, name, length, args.search_warmup, 1, timeout, None)
    if attempt.record:
        found = (f" ({attempt.record['tokens_per_second']:,.0f} tokens/s, reserved peak "
                 f"{gib(attempt.record['peak_reserved_bytes'])} GiB)")
    else:
        found = " " + attempt.detail[-300:]
    print(f"  {name} at {length}: {attempt.outcome.value}{found}", flush=True)
    return attempt


def system_file(args, name: str) -> Path:
    """Where the driver writes system ``name``'s schedule under ``--out``."""
    return Path(args.out) / system_file_name(name)


def fit_prediction_command(args, name: str, device_memory: int) -> list[str]:
    """``schedlang simulate --fit --json`` on the system's schedule (written under ``--out``) at
    ``--search-start``."""
    program = system_program(benchmark_schedule(args), name, args.search_start, 1, train_dtype(args.device))
    path = system_file(args, name).with_suffix(".fit.sched")
    path.write_text(program.source_text, encoding="utf-8")
    return [
        sys.executable, "-m", "schedlang", "simulate", str(path), "--fit", "--json",
        "--device-memory", f"{device_memory}B", "--step", str(args.search_step), "--max-length", str(args.search_max),
    ]


def fit_proposal(stdout: str) -> dict | None:
    """The proposal (``fits``) of ``simulate --fit --json`` output, None when nothing fit or it printed no JSON."""
    try:
        return json.loads(stdout).get("fits")
    except json.JSONDecodeError:
        return None


def throughput_lines(attempts: list[Attempt], flops_per_token: float, gemm_rate: float | None) -> list[str]:
    """The throughput table: each system's tokens/s, its model-FLOP rate (``flops_per_token`` times tokens/s:
    recomputation is not counted, so it is the rate at which the step does the model's own work) and that rate's
    share of the same job's GEMM rate (blank without one)."""
    lines = [
        "| system | length | tokens/s | step (s, median) | model TFLOP/s | of the GEMM rate | peak allocated (GiB) "
        "| peak reserved (GiB) | outcome |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for attempt in attempts:
        record = attempt.record
        if record is None:
            lines.append(f"| {attempt.system} | {attempt.length} | | | | | | | {attempt.outcome.value}"
                         + (f": {attempt.detail}" if attempt.outcome is Outcome.SKIPPED else "") + " |")
            continue
        rate = flops_per_token * record["tokens_per_second"]
        share = f"{rate / gemm_rate:.1%}" if gemm_rate else ""
        lines.append(
            f"| {attempt.system} | {attempt.length} | {record['tokens_per_second']:,.0f} | "
            f"{record['step_seconds']:.3f} | {rate / 1e12:.1f} | {share} | {gib(record['peak_bytes'])} | "
            f"{gib(record['peak_reserved_bytes'])} | {attempt.outcome.value} |"
        )
    return lines


def search_lines(results: dict[str, tuple[Attempt | None, list[Attempt], str]]) -> list[str]:
    lines = [
        "| system | longest that trains | tokens/s there | peak allocated (GiB) | peak reserved (GiB) | "
        "lengths tried | search |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (best, attempts, ending) in results.items():
        tried = ", ".join(f"{attempt.length} {attempt.outcome.value}" for attempt in attempts)
        if best is None:
            lines.append(f"| {name} | none | | | | {tried} | {ending} |")
            continue
        record = best.record
        lines.append(
            f"| {name} | {best.length} | {record['tokens_per_second']:,.0f} | {gib(record['peak_bytes'])} | "
            f"{gib(record['peak_reserved_bytes'])} | {tried} | {ending} |"
        )
    return lines


def prediction_lines(rows: list[dict]) -> list[str]:
    """Each schedlang system: measured longest and reserved peak, the memory model's peak there, and what
    ``simulate --fit`` proposes."""
    lines = [
        "| system | measured longest | measured reserved peak (GiB) | predicted peak there (GiB) | "
        "--fit length | --fit chunks | --fit reserved peak (GiB) | --fit tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        fit = row["fit"]
        if fit:
            fit_cells = (f"{fit['length']} | {fit['n_chunks']} | {max(fit['reserved_gib']):.1f} | "
                         f"{fit['tokens_per_second']:,.0f}")
        else:
            fit_cells = ("simulate failed: " + row["fit_error"].splitlines()[-1]) if row["fit_error"] else "nothing fits"
            fit_cells += " | | |"
        measured = (f"{row['measured_length']} | {gib(row['measured_reserved_bytes'])} | "
                    f"{gib(row['predicted_reserved_bytes'])}") if row["measured_length"] else "none | | "
        lines.append(f"| {row['system']} | {measured} | {fit_cells} |")
    return lines


def driver(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    schedule, dtype = benchmark_schedule(args), train_dtype(args.device)
    for name in args.systems:  # the checker refuses a bad system (chunks that do not cut a length) first
        configs_of(name, schedule, args.length, dtype)
        system_file(args, name).write_text(system_program(schedule, name, args.length, 1, dtype).source_text)
    for name in args.search_systems:
        configs_of(name, schedule, args.search_start, dtype)
    backend = kernel_preflight(args.device, Path(__file__).resolve(), args.allow_torch_kernels)
    os.environ["SCHEDLANG_KERNEL_BACKEND"] = backend
    fla_skip = fla_skip_reason(args.device) if FLA_SYSTEM in args.systems + args.search_systems else None
    skips = {FLA_SYSTEM: fla_skip}

    gemm = run_attempt(args, GEMM_SYSTEM, 0, 0, 0, args.throughput_timeout, None) if args.gemm_rate else None
    gemm_rate = gemm.record["flops_per_second"] if gemm is not None and gemm.record else None
    if gemm is not None:
        print(f"  {GEMM_SYSTEM}: {gemm.outcome.value} {gemm.detail[-300:]}", flush=True)
    throughput = []
    for name in args.systems:
        attempt = run_attempt(args, name, args.length, args.warmup, args.steps, args.throughput_timeout, skips.get(name))
        throughput.append(attempt)
        print(f"  {name} at {args.length}: {attempt.outcome.value} {attempt.detail[-300:]}", flush=True)
    base = base_program(schedule)
    model = base.model
    kinds = Counter(kind.value for kind in model.layers)
    blocks = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
    flops_per_token = model_training_flops_per_token(model, args.length, base.sequence.kernel_chunk)
    lines = [f"one device ({args.device}), kernel backend {backend}, {len(model.layers)} blocks ({blocks}) "
             f"d={model.d_model}, one sequence per step, {dtype}", "",
             f"Throughput at --length: model FLOPs {flops_per_token / 1e9:.3f} G a token "
             "(schedlang.lowering.cost.model_training_flops_per_token: forward and backward, recomputation not "
             "counted); " + (f"GEMM rate {gemm_rate / 1e12:.1f} TFLOP/s ({gemm.record['size']}^3 "
                             f"{gemm.record['dtype']}, this job)" if gemm_rate else "GEMM rate not measured"), ""]
    lines += throughput_lines(throughput, flops_per_token, gemm_rate)
    print("\n".join(lines), flush=True)

    measured_memory = [a.record["device_memory_bytes"] for a in throughput if a.record and a.record["device_memory_bytes"]]
    device_memory = args.device_memory or (measured_memory[0] if measured_memory else DEFAULT_DEVICE_MEMORY_BYTES)
    every_system = dict.fromkeys(args.systems + args.search_systems)
    schedlang_systems = [name for name in every_system if is_schedlang_system(name)]
    fits = {  # CPU-only work, run beside the search
        name: subprocess.Popen(fit_prediction_command(args, name, device_memory), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        for name in schedlang_systems
    }

    results = {}
    search_end = time.monotonic() + args.budget
    for index, name in enumerate(args.search_systems):
        share = (search_end - time.monotonic()) / (len(args.search_systems) - index)
        if skips.get(name) is not None:
            results[name] = (None, [], f"skipped: {skips[name]}")
            continue
        results[name] = search_longest(
            lambda length, name=name: search_attempt(args, name, length, search_end),
            args.search_start, args.search_step, args.search_max, time.monotonic() + share,
        )
        # each system's row as soon as it is known: a job cut short keeps what it found
        print("\n".join(search_lines({name: results[name]})), flush=True)
    lines += ["", f"Longest sequence that trains ({args.search_warmup} warm-up steps, then the one timed)", ""]
    lines += search_lines(results)

    rows = []
    for name, process in fits.items():
        stdout, stderr = process.communicate()
        best = results.get(name, (None,))[0]
        rows.append({
            "system": name,
            "fit": fit_proposal(stdout),
            "fit_error": "" if stdout.strip() else stderr.strip()[-600:],
            "measured_length": best.length if best else None,
            "measured_reserved_bytes": best.record["peak_reserved_bytes"] if best else 0,
            "predicted_reserved_bytes": (
                max(predicted_reserved_bytes(system_program(schedule, name, best.length, 1, dtype))) if best else 0
            ),
        })
    lines += ["", f"schedlang simulate --fit on {gib(device_memory)} GiB against the search", ""]
    lines += prediction_lines(rows)
    summary = "\n".join(lines)
    (out / "summary.md").write_text(summary + "\n", encoding="utf-8")
    records = {
        "gemm": gemm.as_json() if gemm is not None else None,
        "model_flops_per_token": flops_per_token,
        "throughput": [attempt.as_json() for attempt in throughput],
        "search": {name: {"longest": best.length if best else None, "ending": ending,
                          "attempts": [attempt.as_json() for attempt in attempts]}
                   for name, (best, attempts, ending) in results.items()},
        "predictions": rows,
        "device_memory_bytes": device_memory,
        "kernel_backend": backend,
    }
    (out / "records.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    print(summary, flush=True)
    return 0


def benchmark_schedule(args: argparse.Namespace) -> BenchmarkSchedule:
    """The schedule the options ask for: --schedule, --tiny."""
    return BenchmarkSchedule(Path(args.schedule), tiny=args.tiny)


DEFAULT_DEVICE_MEMORY_BYTES = 140 * 2**30
"""The device memory ``simulate --fit`` is given when no job reported one (a CPU run) and none was asked for:
an H200's, as ``schedlang simulate`` assumes."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--preflight", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--allow-torch-kernels", action="store_true",
                        help="on a GPU whose Triton kernels fail the preflight, measure the PyTorch kernels "
                        "instead of stopping")
    parser.add_argument("--tiny", action="store_true", help="a tiny model, to check the whole path on CPU")
    parser.add_argument("--length", type=int, default=65536, help="the throughput phase's sequence length")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps of the throughput phase (median)")
    parser.add_argument("--schedule", default=str(ONE_DEVICE_SCHEDULE), help="the schedule file every system revises")
    parser.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS,
                        help="torch, torch+ckpt, fla, schedlang or schedlang:<key>=<value>/... (as pipeline.py)")
    parser.add_argument("--search-systems", nargs="*", default=DEFAULT_SEARCH_SYSTEMS)
    parser.add_argument("--search-start", type=int, default=65536, help="the length search's first length")
    parser.add_argument("--search-step", type=int, default=65536, help="the length search's granularity")
    parser.add_argument("--search-max", type=int, default=1048576, help="the longest length the search tries")
    parser.add_argument("--search-warmup", type=int, default=0, help="steps before the search's timed one")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds of the whole length search")
    parser.add_argument("--throughput-timeout", type=float, default=120.0, help="seconds one throughput job may take")
    parser.add_argument("--search-timeout", type=float, default=150.0, help="seconds one search attempt may take")
    parser.add_argument("--device-memory", type=int, help="bytes simulate --fit fits (default: the GPU's)")
    parser.add_argument("--out", default="benchmark-results/one-device")
    parser.add_argument("--gemm-rate", action=argparse.BooleanOptionalAction, default=True,
                        help="time one large GEMM first, the rate each system's model-FLOP rate is read against")
    args = parser.parse_args()
    if args.preflight:
        return preflight()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
