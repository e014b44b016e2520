"""The chunked Mamba-3 SISO operator (simple GLA's kernels on the trapezoidal update's operands) against the
float64 token loop.

Outputs, every part of the final state (angle, SSM state, last rotated key and input) and the gradients of x,
dt, adt, trap, B, C, the angle rates, D and every part of the initial state; fresh random inputs each run, odd
lengths, kernel outputs NaN-filled (tests/kernels/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_reference_cases import relative_error
from schedlang.kernels.mamba3 import Mamba3State, chunk_mamba3, naive_recurrent_mamba3

TENSORS = ("x", "dt", "adt", "trap", "B", "C", "angles", "D")
STATE_PARTS = ("angle", "ssm", "key", "value")


def make_inputs(batch, length, heads, head_dim, state_size, angle_count, dtype, with_state=True):
    """Random inputs as a Mamba-3 layer makes them: dt a softplus, adt = A dt with A in [-3, -0.05], trap a
    sigmoid, angle rates pi tanh(.)."""

    def draw(*shape):
        return torch.randn(*shape, dtype=torch.float64)

    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    dt = F.softplus(draw(batch, length, heads) - 1.0)
    rate = -torch.empty(heads, dtype=torch.float64).uniform_(0.05, 3.0)
    inputs = {
        "x": draw(batch, length, heads, head_dim).to(dtype),
        "dt": dt.to(dtype),
        "adt": (dt * rate).to(dtype),
        "trap": torch.sigmoid(draw(batch, length, heads)).to(dtype),
        "B": draw(batch, length, heads, state_size).to(dtype),
        "C": draw(batch, length, heads, state_size).to(dtype),
        "angles": (torch.pi * torch.tanh(draw(batch, length, heads, angle_count))).to(dtype),
        "D": draw(heads).to(dtype),
    }
    state = None
    if with_state:
        state = {
            "angle": (torch.rand(batch, heads, angle_count, dtype=torch.float64) * 6.0).to(state_dtype),
            "ssm": draw(batch, heads, state_size, head_dim).to(state_dtype),
            "key": draw(batch, heads, state_size).to(state_dtype),
            "value": draw(batch, heads, head_dim).to(state_dtype),
        }
    gradients = {
        "y": draw(batch, length, heads, head_dim),
        "angle": draw(batch, heads, angle_count),
        "ssm": draw(batch, heads, state_size, head_dim),
        "key": draw(batch, heads, state_size),
        "value": draw(batch, heads, head_dim),
    }
    return inputs, state, gradients


def run_with_grads(function, inputs, state, gradients, **kwargs):
    leaves = {name: None if t is None else t.detach().clone().requires_grad_(True) for name, t in inputs.items()}
    state_leaves = None if state is None else {name: t.detach().clone().requires_grad_(True) for name, t in state.items()}
    initial = None if state_leaves is None else Mamba3State(**state_leaves)
    y, final = function(**leaves, initial_state=initial, output_final_state=True, **kwargs)
    loss = (y.double() * gradients["y"]).sum()
    for name in STATE_PARTS:
        loss = loss + (getattr(final, name).double() * gradients[name]).sum()
    wrt = {name: leaves[name] for name in TENSORS if leaves[name] is not None}
    if state_leaves is not None:
        wrt.update({f"initial_{name}": tensor for name, tensor in state_leaves.items()})
    grads = torch.autograd.grad(loss, list(wrt.values()))
    result = {"y": y.detach(), **{f"final_{name}": getattr(final, name).detach() for name in STATE_PARTS}}
    result.update({f"d{name}": grad for name, grad in zip(wrt, grads)})
    return result


def reference(inputs, state, gradients):
    as64 = {name: None if t is None else t.detach().double() for name, t in inputs.items()}
    state64 = None if state is None else {name: t.detach().double() for name, t in state.items()}
    return run_with_grads(naive_recurrent_mamba3, as64, state64, gradients)


def assert_close(actual, expected, tolerance):
    errors = {name: relative_error(actual[name], expected[name]) for name in expected}
    bad = {name: error for name, error in errors.items() if not error <= tolerance}
    assert not bad, f"relative errors above {tolerance}: {bad} (all: {errors})"


SHAPES = [  # batch, length, heads, head_dim, state_size, angles
    (2, 63, 2, 16, 8, 2),
    (1, 130, 4, 8, 16, 4),
    (1, 1, 2, 8, 8, 4),
    (2, 200, 2, 16, 16, 8),
]


def shape_id(shape):
    return "B{}-T{}-H{}-P{}-N{}-A{}".format(*shape)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "random_state"])
def test_torch_path_matches_the_recurrence_in_float64(shape, with_state):
    inputs, state, gradients = make_inputs(*shape, torch.float64, with_state)
    actual = run_with_grads(chunk_mamba3, inputs, state, gradients, backend="torch")
    assert_close(actual, reference(inputs, state, gradients), 1e-10)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
@pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
def test_triton_path_matches_the_recurrence_in_float32(shape):
    """Triton's interpreter on the CPU (TRITON_INTERPRET=1 from tests/conftest.py), the CUDA path's code."""
    inputs, state, gradients = make_inputs(*shape, torch.float32)
    actual = run_with_grads(chunk_mamba3, inputs, state, gradients, backend="triton")
    assert actual["y"].dtype == torch.float32 and actual["final_ssm"].dtype == torch.float32
    assert_close(actual, reference(inputs, state, gradients), 2e-5)


def test_torch_path_in_float32_stays_within_float32_error():
    inputs, state, gradients = make_inputs(2, 300, 4, 16, 16, 4, torch.float32)
    actual = run_with_grads(chunk_mamba3, inputs, state, gradients, backend="torch")
    assert_close(actual, reference(inputs, state, gradients), 2e-5)


def test_pieces_chained_through_the_state_equal_one_call():
    """The carried last key and input hand the trapezoid's previous-token term across each cut."""
    inputs, state, gradients = make_inputs(1, 150, 2, 8, 8, 2, torch.float64)

    def in_pieces(x, dt, adt, trap, B, C, angles, D, initial_state, output_final_state, backend):
        carried, outputs = initial_state, []
        for start, end in ((0, 1), (1, 70), (70, 150)):
            piece = slice(start, end)
            output, carried = chunk_mamba3(
                x[:, piece], dt[:, piece], adt[:, piece], trap[:, piece], B[:, piece], C[:, piece],
                angles[:, piece], D, initial_state=carried, output_final_state=True, backend=backend,
            )
            outputs.append(output)
        return torch.cat(outputs, dim=1), carried

    actual = run_with_grads(in_pieces, inputs, state, gradients, backend="torch")
    assert_close(actual, reference(inputs, state, gradients), 1e-10)


def test_rows_past_the_turned_pairs_are_not_rotated():
    """With no angle the operator is Mamba-3 without rotation: equal to turning by zero."""
    inputs, state, gradients = make_inputs(1, 40, 2, 8, 8, 2, torch.float64)
    still = {**inputs, "angles": torch.zeros_like(inputs["angles"])}
    actual = run_with_grads(chunk_mamba3, still, None, gradients, backend="torch")
    assert_close(actual, reference(still, None, gradients), 1e-10)
    assert torch.all(actual["final_angle"] == 0)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda inputs: {**inputs, "dt": inputs["dt"][..., :1]}, "dt must have shape"),
        (lambda inputs: {**inputs, "trap": inputs["trap"][:, :3]}, "trap must have shape"),
        (lambda inputs: {**inputs, "B": inputs["B"][:, :, :1]}, "B must have shape"),
        (lambda inputs: {**inputs, "C": inputs["C"][..., :4]}, "C must have B's shape"),
        (lambda inputs: {**inputs, "angles": inputs["angles"].repeat(1, 1, 1, 4)}, "angles must have shape"),
        (lambda inputs: {**inputs, "D": inputs["D"][:1]}, "D must have shape"),
    ],
)
def test_bad_arguments_are_named(change, message):
    inputs, _, _ = make_inputs(1, 8, 2, 8, 8, 2, torch.float64, with_state=False)
    with pytest.raises(ValueError, match=message):
        chunk_mamba3(**change(inputs), backend="torch")


ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
if ON_GPU:
    DEVICE_SHAPES = [(2, 1000, 4, 64, 128, 32), (1, 4096, 2, 64, 64, 16), (3, 300, 3, 32, 32, 16)]
    # float32 runs tf32 matrix products on the GPU: the bound of simple GLA's own GPU tests
    DEVICE_DTYPES = {"float32": (torch.float32, 5e-3), "bfloat16": (torch.bfloat16, 3e-2)}
else:
    DEVICE_SHAPES = [(1, 70, 2, 16, 16, 4)]
    DEVICE_DTYPES = {"float32": (torch.float32, 1e-4)}


def run_on(device: str, backend: str, dtype: torch.dtype, shape) -> tuple[dict, dict]:
    """(results on the CPU, the float64 recurrence's) of fresh inputs of ``shape``, x, B and C in ``dtype`` and the
    rest (and the state, as a layer passes it) in float32, run on ``device`` with ``backend``."""
    inputs, state, gradients = make_inputs(*shape, torch.float64)
    expected = reference(inputs, state, gradients)
    moved = {name: t.to(device, dtype if name in ("x", "B", "C") else torch.float32) for name, t in inputs.items()}
    moved_state = {name: t.to(device, torch.float32) for name, t in state.items()}
    moved_gradients = {name: t.to(device) for name, t in gradients.items()}
    actual = run_with_grads(chunk_mamba3, moved, moved_state, moved_gradients, backend=backend)
    return {name: t.cpu() for name, t in actual.items()}, expected


@pytest.mark.parametrize("shape", DEVICE_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype_name", sorted(DEVICE_DTYPES))
def test_triton_path_on_the_device_matches_the_recurrence(shape, dtype_name):
    """Real sizes on a GPU (float32 and bfloat16, the state kept in float32 as a layer passes it), one small case
    in Triton's interpreter on the CPU."""
    dtype, tolerance = DEVICE_DTYPES[dtype_name]
    actual, expected = run_on(DEVICE, "triton", dtype, shape)
    if ON_GPU:  # the angle gradients are held by the test below
        expected = {name: t for name, t in expected.items() if name not in ANGLE_GRADIENTS}
    assert_close(actual, expected, tolerance)


ANGLE_GRADIENTS = ("ddt", "dangles", "dinitial_angle")
"""Gradients that reach the angles: each a reverse cumulative sum over the sequence of terms that nearly cancel
(a rotation of every position by one angle changes nothing), formed from the operator's dq and dk. With 16-bit
dq and dk they were 6-20% off the float64 recurrence (H200 and CPU, 2026-12-03), so the operator runs in float32
([Note: mamba3 operator precision] in kernels/mamba3/chunk.py); under tf32 on the H200 they were still 1.1e-2 to
1.6e-2 off at 4K tokens, above float32's 5e-3 bound and within bfloat16's 3e-2."""


def angle_gradient_errors(dtype: torch.dtype, device: str, backend: str, shape) -> dict[str, float]:
    actual, expected = run_on(device, backend, dtype, shape)
    return {name: relative_error(actual[name], expected[name]) for name in ANGLE_GRADIENTS}


def test_angle_gradients_of_bfloat16_inputs_within_bfloat16s_bound():
    """The batched PyTorch path with bfloat16 x, B and C: the angle gradients were 3.2e-2 to 4.8e-2 off at this
    size with a bfloat16 operator, about 3e-3 with the float32 one."""
    errors = angle_gradient_errors(torch.bfloat16, "cpu", "torch", (1, 512, 2, 32, 32, 8))
    assert max(errors.values()) < 1e-2, errors


@pytest.mark.skipif(not ON_GPU, reason="the bfloat16 kernels at real sizes run on a GPU")
def test_angle_gradients_on_the_device_in_bfloat16():
    """Not yet run on a GPU: the float32 operator under tf32 measured 1.1e-2 to 1.6e-2 here with float32 inputs."""
    errors = angle_gradient_errors(torch.bfloat16, DEVICE, "triton", (1, 4096, 2, 64, 64, 16))
    assert max(errors.values()) < DEVICE_DTYPES["bfloat16"][1], errors


@pytest.mark.skipif(not ON_GPU, reason="the tf32 kernels run on a GPU")
@pytest.mark.xfail(strict=True, reason="tf32 products leave the angle gradients 1.1e-2-1.6e-2 off; see ANGLE_GRADIENTS")
def test_angle_gradients_on_the_device_within_float32s_bound():
    errors = angle_gradient_errors(torch.float32, DEVICE, "triton", (1, 4096, 2, 64, 64, 16))
    assert max(errors.values()) < DEVICE_DTYPES["float32"][1], errors
