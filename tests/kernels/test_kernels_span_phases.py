"""The operators' phases ([Note: span phases]) put back together across emulated ranks equal the whole span.

One process plays P sequence-parallel ranks: each prepares its slice, reads its boundary terms (the final state
from a zero state, the initial-state gradient from its outputs alone, the total log decay), the scan that the
runtime's collectives run is done here by hand, and each rank finishes from its incoming state and its
final-state gradient. Outputs, final state and every gradient are compared with the float64 naive recurrence
on the whole span. On a CPU the Triton path runs in the interpreter at tiny sizes; on a GPU at real sizes,
float32 and bfloat16, which is the check of the GPU path of sequence parallelism that needs one device only.
"""

import pytest
import torch

from kernel_reference_cases import OPERATORS, assert_close, make_inputs, reference
from schedlang.kernels.gla import chunk_triton as gla_chunk_triton
from schedlang.kernels.gla.chunk import implementation_for as gla_implementation
from schedlang.kernels.simple_gla.chunk import implementation_for as simple_gla_implementation

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
IMPLEMENTATION_FOR = {"gla": gla_implementation, "simple_gla": simple_gla_implementation}

if ON_GPU:
    CASES = [((1, 4096, 4, 128), (1000, 1500, 1596)), ((2, 2048, 2, 64), (64, 1984)), ((1, 3000, 3, 128), (999, 2001))]
    DTYPES = {"float32": (torch.float32, 5e-3), "bfloat16": (torch.bfloat16, 3e-2)}
    BACKENDS = ["triton"]
else:
    CASES = [((1, 150, 2, 16), (50, 37, 63)), ((2, 100, 1, 16), (64, 36))]
    DTYPES = {"float32": (torch.float32, 5e-5)}
    BACKENDS = ["torch", "triton"]


def _decay_view(total_log_decay: torch.Tensor) -> torch.Tensor:
    gamma = total_log_decay.exp()
    return gamma[:, :, None, None] if gamma.dim() == 2 else gamma[..., None]


def run_emulated_ranks(implementation, inputs, lengths, save_states):
    """(o, final_state, dq, dk, dv, dg, d_initial_state) of the span split into ``lengths`` emulated ranks."""
    bounds = [sum(lengths[:rank]) for rank in range(len(lengths) + 1)]
    slices = [slice(bounds[rank], bounds[rank + 1]) for rank in range(len(lengths))]
    tensors = [[tensor[:, piece].contiguous() for tensor in (inputs.q, inputs.k, inputs.v, inputs.g)] for piece in slices]
    scale = inputs.q.shape[-1] ** -0.5
    prepared = [implementation.prepare_forward(*rank_tensors) for rank_tensors in tensors]
    decays = [_decay_view(implementation.total_log_decay(rank_prepared)) for rank_prepared in prepared]
    states_in = [inputs.initial_state]
    for rank_prepared, decay in zip(prepared[:-1], decays[:-1]):
        carry = states_in[-1]
        local = implementation.local_final_state(rank_prepared)
        states_in.append(local if carry is None else decay * carry + local)
    outputs, saved = [], []
    for rank_tensors, rank_prepared, state_in in zip(tensors, prepared, states_in):
        o, final_state, rank_saved = implementation.finish_forward(rank_prepared, *rank_tensors, scale, state_in, save_states)
        outputs.append(o)
        saved.append(rank_saved)
    output_grads = [inputs.output_grad[:, piece].contiguous() for piece in slices]
    prepared_backward = [
        implementation.prepare_backward(*rank_tensors, do, scale, rank_saved)
        for rank_tensors, do, rank_saved in zip(tensors, output_grads, saved)
    ]
    state_out_grads = [inputs.final_state_grad]
    for rank in range(len(lengths) - 1, 0, -1):
        local = implementation.local_initial_state_gradient(prepared_backward[rank])
        state_out_grads.insert(0, local + decays[rank] * state_out_grads[0])
    grads = [
        implementation.finish_backward(rank_prepared, *rank_tensors, scale, state_in, do, state_out_grad, rank_saved)
        for rank_prepared, rank_tensors, state_in, do, state_out_grad, rank_saved in zip(
            prepared_backward, tensors, states_in, output_grads, state_out_grads, saved
        )
    ]
    result = {"o": torch.cat(outputs, dim=1), "final_state": final_state}
    for index, name in enumerate(("dq", "dk", "dv", "dg")):
        result[name] = torch.cat([rank_grads[index] for rank_grads in grads], dim=1)
    if inputs.initial_state is not None:
        result["d_initial_state"] = grads[0][4]
    return result


@pytest.mark.parametrize("operator_name, steep", [("gla", False), ("gla", True), ("simple_gla", False)], ids=["gla", "gla-steep", "simple_gla"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape, lengths", CASES, ids=lambda case: "B{}-T{}-H{}-D{}".format(*case) if len(case) == 4 else "-".join(map(str, case)))
@pytest.mark.parametrize("random_initial_state, save_states", [(False, False), (True, True)], ids=["zero_state", "random_state-saved"])
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_phases_across_emulated_ranks_equal_the_whole_span(
    monkeypatch, operator_name, steep, backend, shape, lengths, random_initial_state, save_states, dtype_name
):
    """``steep``: every GLA chunk takes the sub-chunk kernels (span limit 0)."""
    if steep:
        if backend != "triton":
            pytest.skip("the PyTorch path has no steep kernels")
        monkeypatch.setattr(gla_chunk_triton, "SPAN_LIMIT", 0.0)
    operator = OPERATORS[operator_name]
    dtype, tolerance = DTYPES[dtype_name]
    if backend == "triton" and dtype == torch.bfloat16 and not ON_GPU:
        pytest.skip("bfloat16 never reaches Triton's interpreter")
    assert sum(lengths) == shape[1]
    inputs = make_inputs(operator, *shape, "weak", random_initial_state, dtype, DEVICE)
    expected = reference(operator, inputs)
    if not random_initial_state:
        expected.pop("d_initial_state", None)
    implementation = IMPLEMENTATION_FOR[operator_name](backend, inputs.q)
    assert implementation.name == backend
    actual = run_emulated_ranks(implementation, inputs, lengths, save_states)
    assert_close(actual, expected, tolerance)
