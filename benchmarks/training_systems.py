"""What the pipeline and one-device benchmarks both train and how they launch it: schedlang's Trainer as a
system with a ``step()``, the torch peers' full-sequence stage and loss, the dtype of every system, the kernel
preflight, and a measurement job in a fresh process whose records come back as JSON.

Every system has ``step()`` (one forward, backward and optimizer step), ``model_state_bytes()`` and
``close()``. A job prints each finished record list as one JSON line starting ``[{"system"``, so that a job
cut short (out of memory, a timeout) still hands back what it finished.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks.common import model_state_bytes


class SchedlangSystem:
    """schedlang's runtime: one Trainer running the configs of a compiled schedule."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.step_index = 0
        self.pending_loss = None  # read one step late, as Trainer.train does: [Note: loss without a barrier]

    def model_state_bytes(self) -> int:
        return model_state_bytes(self.trainer.model, self.trainer.optimizer)

    def step(self) -> None:
        loss = self.trainer.queue_step(self.step_index)
        self.trainer.optimizer_step()
        if self.pending_loss is not None:
            self.pending_loss.value()
        self.pending_loss = loss
        self.step_index += 1

    def close(self) -> None:
        if self.pending_loss is not None:
            self.pending_loss.value()
        messenger = self.trainer.executor.messenger
        for group in (messenger.activation_group, messenger.gradient_group):
            dist.destroy_process_group(group)
        self.trainer = None


class FullSequenceStage(nn.Module):
    """The same stage module as schedlang's, called once per full-sequence microbatch."""

    def __init__(self, stage) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.stage(inputs, [None] * self.stage.n_states)
        if self.stage.is_last:
            return self.stage.lm_head(self.stage.final_norm(hidden))
        return hidden


def full_sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def train_dtype(device: str) -> str:
    """The ``train.dtype`` of every system: bf16 on a GPU, fp32 on the CPU."""
    return "bf16" if device == "cuda" else "fp32"


def run_job(command: list[str], environment: dict[str, str], timeout: float, result: Path) -> tuple[int, list, str]:
    """Run one measurement job: its exit code (124 when ``timeout`` seconds ran out), its records and its output.

    The records are the list the job wrote to ``result`` when it exited cleanly, else every record list it
    printed as a JSON line before it stopped. ``result`` is removed first, so a stale file is never read.
    """
    result.unlink(missing_ok=True)
    try:
        completed = subprocess.run(command, timeout=timeout, capture_output=True, text=True, env=environment)
        code, output = completed.returncode, completed.stdout + completed.stderr
    except subprocess.TimeoutExpired as error:
        code, output = 124, _text(error.stdout) + _text(error.stderr)
    if code == 0 and result.exists():
        return code, json.loads(result.read_text()), output
    records = []
    for line in output.splitlines():
        if line.startswith('[{"system"'):
            records.extend(json.loads(line))
    return code, records, output


def _text(stream: bytes | str | None) -> str:
    if stream is None:
        return ""
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream


def error_lines(output: str, limit: int = 1500) -> str:
    """The lines of a job's output that name an error, at most the last ``limit`` characters."""
    return "\n".join(line for line in output.splitlines() if "Error" in line or "error" in line)[-limit:]


def kernel_preflight(device: str, script: Path, allow_torch_kernels: bool = False) -> str:
    """Triton on the GPU if it runs and agrees with the PyTorch path on a bf16 problem; PyTorch on the CPU.

    Runs ``script --preflight`` (a benchmark whose ``--preflight`` calls :func:`preflight`) in a subprocess,
    so the driver holds no CUDA context while the jobs measure memory. On a GPU where the Triton kernels fail it
    stops the benchmark (SystemExit naming why) unless ``allow_torch_kernels``: a run on the PyTorch fallback
    measures something else than the benchmark claims (2026-12-03: a compile error sent a whole mamba2 run there).
    """
    if device != "cuda":
        return "torch"
    completed = subprocess.run([sys.executable, str(script), "--preflight"], capture_output=True, text=True, timeout=300)
    print(completed.stdout.strip(), completed.stderr.strip()[-800:], flush=True)
    lines = completed.stdout.strip().splitlines()
    backend = lines[-1] if completed.returncode == 0 and lines and lines[-1] in ("triton", "torch") else "torch"
    if backend == "torch" and not allow_torch_kernels:
        raise SystemExit(
            f"{script.name}: the Triton kernels failed the preflight on the GPU (above); fix them, or pass "
            "--allow-torch-kernels to benchmark the PyTorch kernels on purpose"
        )
    return backend


def preflight() -> int:
    from schedlang.kernels import chunk_gla

    try:
        generator = torch.Generator(device="cuda").manual_seed(0)
        shape = (1, 512, 4, 128)
        q, k, v = (torch.randn(shape, device="cuda", generator=generator, dtype=torch.bfloat16) for _ in range(3))
        g = F.logsigmoid(torch.randn(shape, device="cuda", generator=generator)) / 16
        weight = torch.randn(shape, device="cuda", generator=generator)
        outputs = {}
        for backend in ("torch", "triton"):
            leaves = [tensor.detach().clone().requires_grad_(True) for tensor in (q, k, v, g)]
            o, state = chunk_gla(*leaves, initial_state=None, output_final_state=True, backend=backend)
            ((o.float() * weight).sum() + state.sum()).backward()
            outputs[backend] = (o.float(), state.float(), *(leaf.grad.float() for leaf in leaves))
        error = max(
            float((outputs["triton"][i] - outputs["torch"][i]).norm() / outputs["torch"][i].norm()) for i in range(6)
        )
        print(f"kernel preflight: triton vs torch relative error {error:.2e}", flush=True)
        print("triton" if error < 2e-2 else "torch")
    except Exception as error:
        print(f"kernel preflight: triton failed ({type(error).__name__}: {error}); using the PyTorch kernels")
        print("torch")
    return 0
