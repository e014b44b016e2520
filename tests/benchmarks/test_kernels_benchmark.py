"""benchmarks/kernels.py's plumbing, on the CPU: the operands it draws reach each operator in the order the
operator takes them (checked against the float64 token-by-token reference), and its forward+backward closure
returns one finite gradient per input. The timings themselves need a GPU."""

import pytest
import torch

from benchmarks import kernels as benchmark
from schedlang.kernels.gdn import naive_recurrent_gated_delta_rule
from schedlang.kernels.gla.naive import naive_recurrent_gla
from schedlang.kernels.simple_gla.naive import naive_recurrent_simple_gla

REFERENCES = {"gla": naive_recurrent_gla, "simple_gla": naive_recurrent_simple_gla, "gdn": naive_recurrent_gated_delta_rule}


def in_float64(function):
    def call(*operands, initial_state=None, output_final_state=False):
        state = None if initial_state is None else initial_state.double()
        return function(*(operand.double() for operand in operands), initial_state=state, output_final_state=output_final_state)

    return call


@pytest.mark.parametrize("operator", ["gla", "simple_gla", "gdn"])
@pytest.mark.parametrize("with_state", [False, True])
def test_operands_reach_the_operator_in_its_order(operator, with_state):
    torch.manual_seed(0)
    inputs = benchmark.make_inputs(operator, 40, 2, 16, with_state, device="cpu")
    function = benchmark.OURS[operator]
    # bf16 operands: the difference is bf16 rounding of the output; swapped or missing operands give O(1)
    assert benchmark.agreement(function, in_float64(REFERENCES[operator]), inputs, with_state) < 2e-2
    gradients = benchmark.gradient_step(function, inputs, with_state)()
    leaves = [tensor for tensor in inputs if tensor is not None]
    assert len(gradients) == len(leaves) == (len(inputs) if with_state else len(inputs) - 1)
    for gradient, leaf in zip(gradients, leaves):
        assert gradient.shape == leaf.shape and bool(torch.isfinite(gradient).all())


def test_gdn_inputs_are_what_gated_deltanet_feeds():
    q, k, v, g, beta, state = benchmark.make_inputs("gdn", 32, 2, 16, True, device="cpu")
    assert torch.allclose(k.float().norm(dim=-1), torch.ones(1, 32, 2), atol=1e-2)
    assert bool(((beta > 0) & (beta < 1)).all()) and bool((g <= 0).all())
    assert beta.requires_grad and k.requires_grad and k.is_leaf
