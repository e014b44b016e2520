"""Shared inputs and comparisons for the kernel tests: fresh random inputs, float64 references."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from schedlang.kernels import chunk_gla, chunk_simple_gla
from schedlang.kernels.gla import naive_recurrent_gla
from schedlang.kernels.simple_gla import naive_recurrent_simple_gla


@dataclass(frozen=True)
class Operator:
    name: str
    chunked: object
    naive: object
    gate_per_key: bool


OPERATORS = {
    "gla": Operator("gla", chunk_gla, naive_recurrent_gla, True),
    "simple_gla": Operator("simple_gla", chunk_simple_gla, naive_recurrent_simple_gla, False),
}

DECAY_STRENGTH = {"weak": 0.05, "strong": 4.0}


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    initial_state: torch.Tensor | None
    output_grad: torch.Tensor
    final_state_grad: torch.Tensor

    def leaves(self) -> list[torch.Tensor]:
        tensors = [self.q, self.k, self.v, self.g]
        return tensors + ([self.initial_state] if self.initial_state is not None else [])


def make_inputs(
    operator: Operator,
    batch: int,
    length: int,
    heads: int,
    dim: int,
    decay: str,
    random_initial_state: bool,
    dtype: torch.dtype,
    device: str = "cpu",
    generator_seed: int | None = None,
    value_dim: int | None = None,
) -> Inputs:
    """Random inputs, keys ``dim`` wide and values ``value_dim`` (default ``dim``); the log-gate is
    logsigmoid(noise) scaled so 'strong' decays by exp(-4) a token or more."""
    value_dim = dim if value_dim is None else value_dim
    generator = torch.Generator().manual_seed(generator_seed) if generator_seed is not None else None

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    gate_shape = (batch, length, heads, dim) if operator.gate_per_key else (batch, length, heads)
    gate = F.logsigmoid(draw(*gate_shape) + 2.0) * DECAY_STRENGTH[decay]
    state = draw(batch, heads, dim, value_dim) if random_initial_state else None
    return Inputs(
        q=draw(batch, length, heads, dim).to(device, dtype),
        k=draw(batch, length, heads, dim).to(device, dtype),
        v=draw(batch, length, heads, value_dim).to(device, dtype),
        g=gate.to(device, dtype),
        initial_state=None if state is None else state.to(device, torch.float32 if dtype != torch.float64 else dtype),
        output_grad=draw(batch, length, heads, value_dim).to(device, dtype),
        final_state_grad=draw(batch, heads, dim, value_dim).to(device, torch.float32 if dtype != torch.float64 else dtype),
    )


def run_with_grads(function, inputs: Inputs, **kwargs) -> dict[str, torch.Tensor]:
    """Forward + backward of `function(q, k, v, g, initial_state=..., output_final_state=True)`."""
    leaves = [tensor.detach().clone().requires_grad_(True) for tensor in inputs.leaves()]
    q, k, v, g = leaves[:4]
    initial_state = leaves[4] if len(leaves) == 5 else None
    output, final_state = function(q, k, v, g, initial_state=initial_state, output_final_state=True, **kwargs)
    loss = (output.double() * inputs.output_grad.double()).sum() + (final_state.double() * inputs.final_state_grad.double()).sum()
    grads = torch.autograd.grad(loss, leaves)
    names = ["dq", "dk", "dv", "dg", "d_initial_state"]
    result = {"o": output.detach(), "final_state": final_state.detach()}
    result.update({name: grad for name, grad in zip(names, grads)})
    return result


def reference(operator: Operator, inputs: Inputs) -> dict[str, torch.Tensor]:
    """The naive recurrence in float64, on the inputs' device."""
    as64 = Inputs(*[None if t is None else t.detach().double() for t in vars(inputs).values()])
    return run_with_grads(operator.naive, as64)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected||; an exactly-zero reference (dg at T=1 from a zero state) is
    compared absolutely, with every input of order one."""
    actual = actual.detach().double().cpu()
    expected = expected.detach().double().cpu()
    if not torch.isfinite(actual).all():
        return float("inf")
    return ((actual - expected).norm() / expected.norm().clamp_min(1.0)).item()


def assert_close(actual: dict, expected: dict, tolerance: float) -> None:
    errors = {name: relative_error(actual[name], expected[name]) for name in expected}
    bad = {name: error for name, error in errors.items() if not error <= tolerance}
    assert not bad, f"relative errors above {tolerance}: {bad} (all: {errors})"
