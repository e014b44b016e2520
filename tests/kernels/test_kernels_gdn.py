"""The chunked gated delta rule (pure PyTorch, autograd backward) against the token-by-token recurrence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from schedlang.kernels import chunk_gated_delta_rule
from schedlang.kernels.gdn import naive_recurrent_gated_delta_rule

GRADIENT_NAMES = ["dq", "dk", "dv", "dg", "dbeta", "d_initial_state"]


def make_inputs(batch, length, heads, dim, decay, random_state, dtype, seed):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    strength = {"weak": 0.05, "strong": 4.0}[decay]
    tensors = {
        "q": draw(batch, length, heads, dim),
        "k": F.normalize(draw(batch, length, heads, dim), dim=-1),
        "v": draw(batch, length, heads, dim),
        "g": F.logsigmoid(draw(batch, length, heads) + 2.0) * strength,
        "beta": torch.sigmoid(draw(batch, length, heads)),
        "initial_state": draw(batch, heads, dim, dim) if random_state else None,
    }
    upstream = {"o": draw(batch, length, heads, dim), "final_state": draw(batch, heads, dim, dim)}
    return {name: None if t is None else t.to(dtype) for name, t in tensors.items()}, upstream


def run_with_grads(function, inputs, upstream, **kwargs):
    names = [name for name in ("q", "k", "v", "g", "beta", "initial_state") if inputs[name] is not None]
    leaves = {name: inputs[name].detach().clone().requires_grad_(True) for name in names}
    output, final_state = function(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
        initial_state=leaves.get("initial_state"), output_final_state=True, **kwargs,
    )
    loss = (output.double() * upstream["o"]).sum() + (final_state.double() * upstream["final_state"]).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    result = {"o": output.detach(), "final_state": final_state.detach()}
    result.update({"d" + name: grad for name, grad in zip(names, grads)})
    return result


def relative_error(actual, expected):
    actual, expected = actual.double(), expected.double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1.0))


def assert_close(actual, expected, tolerance):
    errors = {name: relative_error(actual[name], expected[name]) for name in expected}
    assert all(error <= tolerance for error in errors.values()), errors


SHAPES = [(2, 63, 2, 16), (1, 130, 3, 32), (1, 1, 2, 16), (2, 200, 1, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-T{}-H{}-D{}".format(*s))
@pytest.mark.parametrize("decay", ["weak", "strong"])
@pytest.mark.parametrize("random_state", [False, True], ids=["zero_state", "random_state"])
def test_chunked_matches_the_recurrence_in_float64(shape, decay, random_state):
    inputs, upstream = make_inputs(*shape, decay, random_state, torch.float64, seed=sum(shape))
    expected = run_with_grads(naive_recurrent_gated_delta_rule, inputs, upstream)
    assert_close(run_with_grads(chunk_gated_delta_rule, inputs, upstream), expected, 1e-10)


def test_float32_stays_within_float32_error():
    inputs, upstream = make_inputs(1, 300, 2, 32, "strong", True, torch.float32, seed=4)
    as64 = {name: None if t is None else t.double() for name, t in inputs.items()}
    expected = run_with_grads(naive_recurrent_gated_delta_rule, as64, upstream)
    actual = run_with_grads(chunk_gated_delta_rule, inputs, upstream)
    assert actual["o"].dtype == torch.float32 and actual["final_state"].dtype == torch.float32
    assert_close(actual, expected, 1e-4)


@pytest.mark.parametrize("cuts", [[64], [17, 100], [1, 64, 65, 190]], ids=["2pieces", "3pieces", "5pieces"])
def test_chaining_pieces_equals_one_call(cuts):
    inputs, upstream = make_inputs(1, 220, 2, 16, "strong", True, torch.float64, seed=8)

    def pieces(q, k, v, g, beta, initial_state=None, output_final_state=True):
        outputs, state, bounds = [], initial_state, [0, *cuts, q.shape[1]]
        for start, end in zip(bounds[:-1], bounds[1:]):
            part = slice(start, end)
            output, state = chunk_gated_delta_rule(
                q[:, part], k[:, part], v[:, part], g[:, part], beta[:, part], initial_state=state, output_final_state=True
            )
            outputs.append(output)
        return torch.cat(outputs, dim=1), state

    assert_close(run_with_grads(pieces, inputs, upstream), run_with_grads(chunk_gated_delta_rule, inputs, upstream), 1e-10)


def test_invalid_arguments_raise_value_error():
    inputs, _ = make_inputs(1, 10, 2, 16, "weak", False, torch.float32, seed=1)
    q, k, v, g, beta = (inputs[name] for name in ("q", "k", "v", "g", "beta"))
    with pytest.raises(ValueError, match="beta must be"):
        chunk_gated_delta_rule(q, k, v, g, beta[:, :5])
    with pytest.raises(ValueError, match="only the PyTorch path"):
        chunk_gated_delta_rule(q, k, v, g, beta, backend="triton")
    with pytest.raises(ValueError, match="g must have shape"):
        chunk_gated_delta_rule(q, k, v, g[..., None].expand(-1, -1, -1, 16), beta)
