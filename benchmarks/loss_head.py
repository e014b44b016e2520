"""The last stage's final norm, LM head and loss: the plain path against the fused one, in one process.

``plain`` is ``StageModel.reference_loss``: the whole logits ``[T, V]`` in the model's dtype, a float32 copy
and ``F.cross_entropy`` (which keeps the float32 log-softmax for the backward). ``fused`` is
``StageModel.loss``, the path training takes: the head and the loss block by block of tokens ([Note: fused
head and loss] in schedlang.runtime.linear_cross_entropy), once per ``--block-tokens`` value (``default``:
the runtime's choice for the vocabulary) and per ``--loss-backends`` value (each block's loss and logits
gradient in PyTorch's kernels or in one Triton kernel; ``auto``: the runtime's choice,
``schedlang.runtime.mixer_base.loss_kernel_backend``). The model is benchmarks/pipeline.py's (the 1B GLA's ``d_model``
and ``vocab`` from benchmarks/schedules/gla_1b_pp2.sched); the head is built alone, as
``schedlang.runtime.profiling`` builds its ``head`` part, and fed random hidden states and targets.

Per path: the median milliseconds of forward+backward (the loss divided by the token count, as a step
divides it, then ``backward``; gradients set to None between iterations) and of the forward alone (with
grad, as a training step runs it), the peak memory allocated above what was allocated before (CUDA only),
what the forward leaves for the backward (CUDA only), and the relative difference of the loss and of the
hidden states' gradient from the plain path's.

    python3 benchmarks/loss_head.py [--tokens 65536] [--dtype bf16] [--block-tokens default 2048 8192]
        [--loss-backends auto torch triton] [--warmup 2] [--iterations 5] [--tiny] [--device cuda]

``--tiny`` runs the benchmarks' tiny model over a few hundred tokens (on the CPU unless ``--device`` says
otherwise): the whole path, no meaningful numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: the benchmarks package lives in the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median_ms, memory_now, peak_memory, release, reset_peak, synchronize  # noqa: E402
from benchmarks.pipeline_schedule import PIPELINE_SCHEDULE, TORCH_SYSTEM, BenchmarkSchedule, system_configs  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TINY_TOKENS = 300


@dataclass(frozen=True)
class PathResult:
    path: str  # "plain", or "fused (BACKEND)"
    block_tokens: int | None  # None: the plain path
    step_ms: float
    forward_ms: float
    peak_bytes: int  # above what was allocated before the forward
    kept_bytes: int  # allocated after the forward, above what was allocated before it
    loss: float
    hidden_grad: torch.Tensor


def measure_path(model, loss_name: str, hidden, targets, device, warmup: int, iterations: int) -> PathResult:
    """Time and measure ``model.<loss_name>`` over ``hidden`` (a leaf) and ``targets``."""
    loss_function = getattr(model, loss_name)

    def forward() -> torch.Tensor:
        return loss_function(hidden, targets) / targets.numel()

    def step() -> None:
        forward().backward()
        hidden.grad = None
        for parameter in model.parameters():
            parameter.grad = None

    step_ms = median_ms(step, warmup, iterations, device)
    forward_ms = median_ms(forward, warmup, iterations, device)
    release(device)
    before = memory_now(device)
    reset_peak(device)
    loss = forward()
    synchronize(device)
    kept = memory_now(device) - before
    loss.backward()
    synchronize(device)
    peak = peak_memory(device) - before
    hidden_grad = hidden.grad.detach().clone()
    hidden.grad = None
    for parameter in model.parameters():
        parameter.grad = None
    return PathResult(loss_name, None, step_ms, forward_ms, peak, kept, float(loss.detach()), hidden_grad)


def relative_difference(value: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.double()
    return float((value.double() - reference).norm() / reference.norm().clamp_min(1e-30))


def run(args: argparse.Namespace) -> list[PathResult]:
    from schedlang.runtime.linear_cross_entropy import loss_block_tokens
    from schedlang.runtime.mixer_base import LOSS_BACKEND_VARIABLE, loss_kernel_backend
    from schedlang.runtime.model import build_stage_model
    from schedlang.runtime.profiling import part_config

    schedule = BenchmarkSchedule(PIPELINE_SCHEDULE, tiny=args.tiny)
    config = system_configs(schedule, TORCH_SYSTEM, args.tokens, 1, args.dtype).model
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    head_config, layers, is_first, is_last = part_config(config, "head")
    model = build_stage_model(head_config, layers, is_first, is_last, 0, device, dtype)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, args.tokens, config.d_model, generator=generator).to(device, dtype).requires_grad_(True)
    targets = torch.randint(0, config.vocab, (1, args.tokens), generator=generator).to(device)
    results = [measure_path(model, "reference_loss", hidden, targets, device, args.warmup, args.iterations)]
    results[0] = PathResult(**{**results[0].__dict__, "path": "plain"})
    for backend in args.loss_backends:
        for block in args.block_tokens:
            model.loss_block_tokens = loss_block_tokens(config.vocab) if block == "default" else int(block)
            with backend_forced(LOSS_BACKEND_VARIABLE, None if backend == "auto" else backend):
                used = loss_kernel_backend(device)  # on the CPU always PyTorch's
                result = measure_path(model, "loss", hidden, targets, device, args.warmup, args.iterations)
            results.append(PathResult(**{
                **result.__dict__, "path": f"fused ({used})", "block_tokens": model.loss_block_tokens,
            }))
    return results


@contextmanager
def backend_forced(variable: str, backend: str | None) -> Iterator[None]:
    """``variable`` (``SCHEDLANG_LOSS_BACKEND``) set to ``backend`` (None: unset) inside the block, as before after."""
    before = os.environ.get(variable)
    if backend is None:
        os.environ.pop(variable, None)
    else:
        os.environ[variable] = backend
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before


def gib_cell(n_bytes: int, device: torch.device) -> str:
    return f"{n_bytes / 2**30:.2f}" if device.type == "cuda" else "-"


def print_table(args: argparse.Namespace, results: list[PathResult]) -> None:
    device = torch.device(args.device)
    plain = results[0]
    print(f"{args.tokens} tokens, {args.dtype}, {args.device}; memory in GiB above what was allocated before")
    print("| path | block tokens | fwd+bwd ms | fwd ms | peak GiB | kept for bwd GiB | loss rel. diff | dh rel. diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        loss_difference = abs(result.loss - plain.loss) / max(abs(plain.loss), 1e-30)
        hidden_difference = relative_difference(result.hidden_grad, plain.hidden_grad)
        block = "-" if result.block_tokens is None else str(result.block_tokens)
        print(
            f"| {result.path} | {block} | {result.step_ms:.2f} | {result.forward_ms:.2f} | "
            f"{gib_cell(result.peak_bytes, device)} | {gib_cell(result.kept_bytes, device)} | "
            f"{loss_difference:.1e} | {hidden_difference:.1e} |"
        )


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, help=f"tokens (default 65536; {TINY_TOKENS} with --tiny)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument(
        "--block-tokens", nargs="+", default=["default"], help="the fused path's blocks: numbers or 'default'"
    )
    parser.add_argument(
        "--loss-backends", nargs="+", default=["auto"], choices=["auto", "torch", "triton"],
        help="the fused path's loss kernels (default auto: the runtime's choice, loss_kernel_backend)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny model over a few hundred tokens")
    parser.add_argument("--device", help="default: cuda, or cpu with --tiny")
    args = parser.parse_args(argv)
    if args.tokens is None:
        args.tokens = TINY_TOKENS if args.tiny else 65536
    if args.device is None:
        args.device = "cpu" if args.tiny else "cuda"
    for block in args.block_tokens:
        if block != "default" and not (block.isdigit() and int(block) > 0):
            parser.error(f"--block-tokens: {block!r} is neither a positive number nor 'default'")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    print_table(args, run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
