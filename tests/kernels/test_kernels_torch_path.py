"""The pure-PyTorch chunked path (the runtime's CPU path) against the float64 naive recurrence."""

import pytest
import torch

from kernel_reference_cases import OPERATORS, assert_close, make_inputs, reference, run_with_grads, relative_error
from schedlang.kernels import gla, simple_gla

SHAPES = [
    (2, 63, 2, 32),
    (1, 70, 2, 128),
    (1, 64, 1, 32),
    (3, 1, 2, 32),
    (1, 200, 2, 64),
]
LONG_SHAPE = (1, 1000, 2, 64)
PIECE_MODULES = {"gla": gla, "simple_gla": simple_gla}


def shape_id(shape):
    return "B{}-T{}-H{}-D{}".format(*shape)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("decay", ["weak", "strong"])
@pytest.mark.parametrize("random_initial_state", [False, True], ids=["zero_state", "random_state"])
def test_torch_path_matches_naive_recurrence_in_float64(operator_name, shape, decay, random_initial_state):
    operator = OPERATORS[operator_name]
    inputs = make_inputs(operator, *shape, decay, random_initial_state, torch.float64)
    expected = reference(operator, inputs)
    actual = run_with_grads(operator.chunked, inputs, backend="torch")
    assert_close(actual, expected, 1e-10)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
@pytest.mark.parametrize("decay, random_initial_state", [("weak", False), ("strong", True)])
def test_torch_path_at_a_length_far_from_the_chunk_grid(operator_name, decay, random_initial_state):
    operator = OPERATORS[operator_name]
    inputs = make_inputs(operator, *LONG_SHAPE, decay, random_initial_state, torch.float64)
    expected = reference(operator, inputs)
    actual = run_with_grads(operator.chunked, inputs, backend="torch")
    assert_close(actual, expected, 1e-10)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
@pytest.mark.parametrize("decay", ["weak", "strong"])
def test_torch_path_in_float32_stays_within_float32_error(operator_name, decay):
    operator = OPERATORS[operator_name]
    inputs = make_inputs(operator, 2, 300, 2, 64, decay, True, torch.float32)
    expected = reference(operator, inputs)
    actual = run_with_grads(operator.chunked, inputs, backend="torch")
    assert actual["o"].dtype == torch.float32 and actual["final_state"].dtype == torch.float32
    assert_close(actual, expected, 2e-5)


def chained(operator, inputs, cut_points, backend):
    """Run the sequence in pieces, passing the state along, inside one autograd graph."""

    def function(q, k, v, g, initial_state=None, output_final_state=True):
        outputs = []
        state = initial_state
        bounds = [0, *cut_points, q.shape[1]]
        for start, end in zip(bounds[:-1], bounds[1:]):
            piece = slice(start, end)
            output, state = operator.chunked(
                q[:, piece], k[:, piece], v[:, piece], g[:, piece],
                initial_state=state, output_final_state=True, backend=backend,
            )
            outputs.append(output)
        return torch.cat(outputs, dim=1), state

    return run_with_grads(function, inputs)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
@pytest.mark.parametrize("cut_points", [[64], [17, 100], [1, 64, 65, 190]], ids=["2pieces", "3pieces", "5pieces"])
def test_chaining_pieces_equals_one_call(operator_name, cut_points):
    operator = OPERATORS[operator_name]
    inputs = make_inputs(operator, 2, 200, 2, 32, "strong", True, torch.float64)
    whole = run_with_grads(operator.chunked, inputs, backend="torch")
    assert_close(chained(operator, inputs, cut_points, "torch"), whole, 1e-11)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_zeco_local_states_and_all_scan_update_give_the_global_states(operator_name):
    operator = OPERATORS[operator_name]
    pieces = PIECE_MODULES[operator_name]
    inputs = make_inputs(operator, 2, 150, 2, 32, "weak", True, torch.float64)
    expected = pieces.chunk_states(inputs.k, inputs.v, inputs.g, inputs.initial_state)
    local = pieces.local_chunk_states(inputs.k, inputs.v, inputs.g)
    assert torch.count_nonzero(local.states[:, :, 0]) == 0
    blocks = [
        pieces.update_state_rows(inputs.initial_state, local.states[:, :, -1], local.log_decay[:, :, -1], start, start + 8)
        for start in range(0, 32, 8)
    ]
    assert relative_error(torch.cat(blocks, dim=-2), expected[:, :, -1]) < 1e-12
    _, final_state = operator.naive(inputs.q, inputs.k, inputs.v, inputs.g, None, inputs.initial_state, True)
    assert relative_error(expected[:, :, -1], final_state) < 1e-12
    scale = 32**-0.5
    output = pieces.intra_chunk_output(inputs.q, inputs.k, inputs.v, inputs.g, scale)
    output = output + pieces.output_from_states(inputs.q, inputs.g, expected, scale)
    naive_output, _ = operator.naive(inputs.q, inputs.k, inputs.v, inputs.g, scale, inputs.initial_state)
    assert relative_error(output, naive_output) < 1e-12


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_backward_pieces_give_every_gradient(operator_name):
    operator = OPERATORS[operator_name]
    pieces = PIECE_MODULES[operator_name]
    inputs = make_inputs(operator, 1, 140, 2, 32, "strong", True, torch.float64)
    expected = reference(operator, inputs)
    scale = 32**-0.5
    local = pieces.local_chunk_state_gradients(inputs.q, inputs.g, inputs.output_grad, scale)
    assert torch.count_nonzero(local.states[:, :, -1]) == 0
    state_grads = pieces.update_state_rows(inputs.final_state_grad, local.states, local.log_decay)
    states = pieces.chunk_states(inputs.k, inputs.v, inputs.g, inputs.initial_state)
    dq, dk, dv, dg = pieces.intra_chunk_gradients(
        inputs.q, inputs.k, inputs.v, inputs.g, inputs.output_grad, states, state_grads, scale
    )
    actual = {"dq": dq, "dk": dk, "dv": dv, "dg": dg, "d_initial_state": state_grads[:, :, 0]}
    assert_close(actual, {name: expected[name] for name in actual}, 1e-11)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_final_state_is_none_unless_asked_and_output_keeps_v_dtype(operator_name):
    operator = OPERATORS[operator_name]
    inputs = make_inputs(operator, 1, 70, 2, 32, "weak", False, torch.bfloat16)
    output, final_state = operator.chunked(inputs.q, inputs.k, inputs.v, inputs.g, backend="torch")
    assert final_state is None
    assert output.dtype == torch.bfloat16 and output.shape == inputs.v.shape
    _, final_state = operator.chunked(inputs.q, inputs.k, inputs.v, inputs.g, output_final_state=True, backend="torch")
    assert final_state.dtype == torch.float32 and final_state.shape == (1, 2, 32, 32)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_invalid_arguments_raise_value_error(operator_name):
    operator = OPERATORS[operator_name]
    inputs = make_inputs(operator, 1, 20, 2, 32, "weak", False, torch.float32)
    q, k, v, g = inputs.q, inputs.k, inputs.v, inputs.g
    with pytest.raises(ValueError, match="backend must be one of"):
        operator.chunked(q, k, v, g, backend="cuda")
    with pytest.raises(ValueError, match="k must have q's shape"):
        operator.chunked(q, k[:, :10], v, g)
    with pytest.raises(ValueError, match="v must have shape"):
        operator.chunked(q, k, v[:, :10], g)
    with pytest.raises(ValueError, match="g must have shape"):
        operator.chunked(q, k, v, g[..., :1] if operator.gate_per_key else g[:, :, None])
    with pytest.raises(ValueError, match="initial_state must have shape"):
        operator.chunked(q, k, v, g, initial_state=torch.zeros(1, 2, 32, 31))
    with pytest.raises(ValueError, match="q must have shape"):
        operator.chunked(q[0], k[0], v[0], g[0])


def test_auto_backend_choice_follows_device_and_interpreter_flag(monkeypatch):
    from schedlang.kernels.common import Backend, resolve_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_backend("auto", torch.device("cpu")) is Backend.TORCH
    assert resolve_backend("auto", torch.device("cuda", 0)) is Backend.TRITON
    assert resolve_backend("triton", torch.device("cpu")) is Backend.TRITON
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("auto", torch.device("cpu")) is Backend.TRITON
    assert resolve_backend("torch", torch.device("cpu")) is Backend.TORCH
    # the interpreter's tl.dot multiplies bfloat16 bit patterns: auto falls back, triton is refused
    assert resolve_backend("auto", torch.device("cpu"), matmul_dtype=torch.bfloat16) is Backend.TORCH
    assert resolve_backend("auto", torch.device("cpu"), matmul_dtype=torch.float16) is Backend.TRITON
    assert resolve_backend("auto", torch.device("cuda", 0), matmul_dtype=torch.bfloat16) is Backend.TRITON
    with pytest.raises(ValueError, match="interpreter"):
        resolve_backend("triton", torch.device("cpu"), matmul_dtype=torch.bfloat16)


@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_bfloat16_on_the_cpu_is_exact_under_the_interpreter_flag(monkeypatch, operator):
    """With TRITON_INTERPRET=1, bfloat16 CPU tensors must not reach the interpreter's tl.dot (it returned
    values around 1e9 for inputs of size 1); "auto" gives them the PyTorch path instead."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = make_inputs(OPERATORS[operator], 1, 40, 2, 16, "weak", True, torch.bfloat16, "cpu")
    result, expected = run_with_grads(OPERATORS[operator].chunked, inputs), reference(OPERATORS[operator], inputs)
    for name, value in expected.items():
        assert relative_error(result[name], value) < 3e-2, name
    with pytest.raises(ValueError, match="interpreter"):
        run_with_grads(OPERATORS[operator].chunked, inputs, backend="triton")


@pytest.mark.parametrize("span_limit", [1e30, -1.0, None], ids=["all-smooth", "all-steep", "default"])
@pytest.mark.parametrize("decay", ["weak", "strong"])
def test_gla_torch_path_smooth_and_steep_chunks_match_the_reference(monkeypatch, span_limit, decay):
    """The CPU path forms intra-chunk products around one reference on smooth chunks and with the 16-token
    split on steep ones (kernels/gla/gated_products.py); forcing either everywhere, or the default mix
    (strong decay spans more than the limit in some chunks), gives the float64 recurrence."""
    from schedlang.kernels.gla import gated_products

    if span_limit is not None:
        monkeypatch.setattr(gated_products, "SPAN_LIMIT", span_limit)
    operator = OPERATORS["gla"]
    inputs = make_inputs(operator, 2, 300, 2, 32, decay, True, torch.float64, generator_seed=13)
    actual = run_with_grads(operator.chunked, inputs, backend="torch")
    assert_close(actual, reference(operator, inputs), 1e-10)


def test_gated_products_are_differentiable_across_smooth_and_steep_chunks():
    """Autograd through the mixed path equals autograd through the sub-chunk split alone."""
    from schedlang.kernels.gla import gated_products

    generator = torch.Generator().manual_seed(2)
    a, b = (torch.randn(3, 64, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    weights = torch.randn(3, 64, 64, generator=generator, dtype=torch.float64)
    log_gate = torch.nn.functional.logsigmoid(torch.randn(3, 64, 8, generator=generator, dtype=torch.float64)) / 4
    log_gate[1] *= 40  # chunk 1 is steep, chunks 0 and 2 smooth
    gc = log_gate.cumsum(-2)
    smooth, _ = gated_products._chunk_references(gc)
    assert smooth.tolist() == [True, False, True]
    for mixed, split in (
        (gated_products.gated_causal_scores, gated_products._sub_chunk_scores),
        (gated_products.gated_causal_rows, gated_products._sub_chunk_rows),
        (gated_products.gated_causal_columns, gated_products._sub_chunk_columns),
    ):
        first = weights if mixed is not gated_products.gated_causal_scores else a
        leaves_mixed = [t.clone().requires_grad_(True) for t in (first, b, gc)]
        leaves_split = [t.clone().requires_grad_(True) for t in (first, b, gc)]
        out_mixed, out_split = mixed(*leaves_mixed), split(*leaves_split)
        assert relative_error(out_mixed, out_split) < 1e-12
        upstream = torch.randn(out_mixed.shape, generator=generator, dtype=torch.float64)
        grads_mixed = torch.autograd.grad((out_mixed * upstream).sum(), leaves_mixed)
        grads_split = torch.autograd.grad((out_split * upstream).sum(), leaves_split)
        for grad_mixed, grad_split in zip(grads_mixed, grads_split):
            assert torch.isfinite(grad_mixed).all()
            assert relative_error(grad_mixed, grad_split) < 1e-10
