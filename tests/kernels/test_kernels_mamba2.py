"""The chunked Mamba-2 SSD operator (simple GLA's kernels on the SSD's operands) against the float64 token loop.

Outputs, the final state and the gradients of x, dt, A, B, C, D and the initial state; fresh random inputs
each run, odd lengths, grouped B/C, kernel outputs NaN-filled (tests/kernels/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_reference_cases import relative_error
from schedlang.kernels.mamba2 import chunk_mamba2, naive_recurrent_mamba2, ssd_skip, ssd_values_and_gates

LEAVES = ("x", "dt", "A", "B", "C", "D", "initial_state")


def make_ssd_inputs(batch, length, heads, head_dim, groups, state_size, dtype, with_state=True):
    """Random SSD inputs as a Mamba-2 layer makes them: dt a softplus, A = -exp(A_log) with A_log of
    log U(1, 16) scaled so decays per token span exp(-0.01) .. exp(-3)."""

    def draw(*shape):
        return torch.randn(*shape, dtype=torch.float64)

    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inputs = {
        "x": draw(batch, length, heads, head_dim).to(dtype),
        "dt": F.softplus(draw(batch, length, heads) - 1.0).to(dtype),
        "A": -torch.empty(heads, dtype=torch.float64).uniform_(0.05, 3.0).to(dtype),
        "B": draw(batch, length, groups, state_size).to(dtype),
        "C": draw(batch, length, groups, state_size).to(dtype),
        "D": draw(heads).to(dtype),
        "initial_state": draw(batch, heads, state_size, head_dim).to(state_dtype) if with_state else None,
    }
    gradients = {
        "y": draw(batch, length, heads, head_dim),
        "final_state": draw(batch, heads, state_size, head_dim),
    }
    return inputs, gradients


def run_with_grads(function, inputs, gradients, **kwargs):
    leaves = {name: None if tensor is None else tensor.detach().clone().requires_grad_(True)
              for name, tensor in inputs.items()}
    y, final_state = function(**leaves, output_final_state=True, **kwargs)
    loss = (y.double() * gradients["y"]).sum() + (final_state.double() * gradients["final_state"]).sum()
    present = [name for name in LEAVES if leaves[name] is not None]
    grads = torch.autograd.grad(loss, [leaves[name] for name in present])
    result = {"y": y.detach(), "final_state": final_state.detach()}
    result.update({f"d{name}": grad for name, grad in zip(present, grads)})
    return result


def reference(inputs, gradients):
    as64 = {name: None if tensor is None else tensor.detach().double() for name, tensor in inputs.items()}
    return run_with_grads(naive_recurrent_mamba2, as64, gradients)


HEAD_REDUCTION_TOLERANCE = 1e-4
"""dA is one number per head summed over B * T * P * N float32 products: its rounding grows with that count."""


def assert_close(actual, expected, tolerance, head_reduction_tolerance=HEAD_REDUCTION_TOLERANCE, head_sums=("dA",)):
    """Relative errors within ``tolerance``, the per-head sums named in ``head_sums`` within the larger of it and
    ``head_reduction_tolerance``."""
    errors = {name: relative_error(actual[name], expected[name]) for name in expected}
    limits = {name: max(tolerance, head_reduction_tolerance) if name in head_sums else tolerance for name in errors}
    bad = {name: error for name, error in errors.items() if not error <= limits[name]}
    assert not bad, f"relative errors above {tolerance}: {bad} (all: {errors})"


SHAPES = [  # batch, length, heads, head_dim, groups, state_size
    (2, 63, 2, 16, 1, 8),
    (1, 130, 4, 8, 2, 16),
    (1, 1, 2, 8, 2, 8),
    (2, 200, 4, 16, 4, 8),
]


def shape_id(shape):
    return "B{}-T{}-H{}-P{}-G{}-N{}".format(*shape)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "random_state"])
def test_torch_path_matches_the_recurrence_in_float64(shape, with_state):
    inputs, gradients = make_ssd_inputs(*shape, torch.float64, with_state)
    actual = run_with_grads(chunk_mamba2, inputs, gradients, backend="torch")
    assert_close(actual, reference(inputs, gradients), 1e-10)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
@pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
def test_triton_path_matches_the_recurrence_in_float32(shape):
    """Triton's interpreter on the CPU (TRITON_INTERPRET=1 from tests/conftest.py), the CUDA path's code."""
    inputs, gradients = make_ssd_inputs(*shape, torch.float32)
    actual = run_with_grads(chunk_mamba2, inputs, gradients, backend="triton")
    assert actual["y"].dtype == torch.float32 and actual["final_state"].dtype == torch.float32
    assert_close(actual, reference(inputs, gradients), 2e-5)


GROUPED_SHAPES = [  # batch, length, heads, head_dim, groups, state_size: four heads read from G = 1, 2 and 4 groups
    (2, 100, 4, 8, 2, 16),  # two heads a group, the last chunk padded (100 is no multiple of 64)
    (1, 64, 4, 8, 1, 8),
    (1, 150, 4, 16, 4, 8),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", GROUPED_SHAPES, ids=shape_id)
def test_triton_path_reads_b_and_c_by_group(monkeypatch, shape, dtype):
    """The Triton path hands simple GLA's kernels B and C by group, never repeated per head, and matches the
    float64 loop in the output, the final state and every gradient. The kernels compute in float32 for float64
    inputs too, hence one float32 bound for both: 5e-5, as simple GLA's interpreter bound (the final state of
    B1 T64 H4 N8 reached 2.1e-5 on one unseeded draw, 1.1e-5 at most over 60 seeded ones, the same with the
    state walks and the scan before them; 2026-12-06, docs/log.md)."""
    from schedlang.kernels.common import chunk_operator
    from schedlang.kernels.mamba2 import chunk as mamba2_chunk

    def refuse(*_):
        raise AssertionError("B or C repeated per head on the Triton path")

    monkeypatch.setattr(chunk_operator, "repeat_each_head", refuse)
    monkeypatch.setattr(mamba2_chunk, "repeat_each_head", refuse)
    inputs, gradients = make_ssd_inputs(*shape, dtype)
    actual = run_with_grads(chunk_mamba2, inputs, gradients, backend="triton")
    assert actual["dB"].shape == inputs["B"].shape and actual["dC"].shape == inputs["C"].shape
    assert_close(actual, reference(inputs, gradients), 5e-5)


def test_torch_path_in_float32_stays_within_float32_error():
    inputs, gradients = make_ssd_inputs(2, 300, 4, 16, 2, 16, torch.float32)
    actual = run_with_grads(chunk_mamba2, inputs, gradients, backend="torch")
    assert_close(actual, reference(inputs, gradients), 2e-5)


def test_pieces_chained_through_the_state_equal_one_call():
    inputs, gradients = make_ssd_inputs(1, 150, 4, 8, 2, 8, torch.float64)

    def in_pieces(x, dt, A, B, C, D, initial_state, output_final_state, backend):
        state, outputs = initial_state, []
        for start, end in ((0, 1), (1, 70), (70, 150)):
            piece = slice(start, end)
            output, state = chunk_mamba2(x[:, piece], dt[:, piece], A, B[:, piece], C[:, piece], D,
                                         initial_state=state, output_final_state=True, backend=backend)
            outputs.append(output)
        return torch.cat(outputs, dim=1), state

    actual = run_with_grads(in_pieces, inputs, gradients, backend="torch")
    assert_close(actual, reference(inputs, gradients), 1e-10)


def test_without_the_skip_the_output_is_the_recurrence_alone():
    inputs, gradients = make_ssd_inputs(1, 40, 2, 8, 1, 8, torch.float64)
    inputs["D"] = None
    actual = run_with_grads(chunk_mamba2, inputs, gradients, backend="torch")
    assert_close(actual, reference(inputs, gradients), 1e-10)
    with_skip, _ = chunk_mamba2(**{**inputs, "D": torch.ones(2, dtype=torch.float64)}, backend="torch")
    assert relative_error(with_skip - actual["y"], inputs["x"]) < 1e-12


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda inputs: {**inputs, "dt": inputs["dt"][..., :1]}, "dt must have shape"),
        (lambda inputs: {**inputs, "A": inputs["A"][:1]}, "A must have shape"),
        (lambda inputs: {**inputs, "B": inputs["B"][:, :, :, :3].repeat(1, 1, 3, 1)}, "B must have shape"),
        (lambda inputs: {**inputs, "C": inputs["C"][..., :4]}, "C must have B's shape"),
        (lambda inputs: {**inputs, "D": inputs["D"][:1]}, "D must have shape"),
    ],
)
def test_bad_arguments_are_named(change, message):
    inputs, _ = make_ssd_inputs(1, 8, 4, 8, 2, 8, torch.float64, with_state=False)
    with pytest.raises(ValueError, match=message):
        chunk_mamba2(**change(inputs), backend="torch")


GPU_DTYPES = {"float32": (torch.float32, 5e-3), "bfloat16": (torch.bfloat16, 3e-2)}
"""Inputs' dtype and bound on the device: float32 runs the dots in tf32 (simple GLA's own GPU bound, 5e-3)."""
GPU_HEAD_REDUCTION_TOLERANCE = {"float32": 1.5e-1, "bfloat16": 3e-2}
"""dA on the GPU: each head's sum over B * T * P * N products whose terms cancel. Float32 inputs are rounded to
tf32 (10-bit mantissas) inside the products, so their dA is the least exact of any dtype's: over eight draws of
B1 T4096 H4 N128 on an H100 (2026-12-06, docs/log.md) it ranged from 9.1e-4 to 6.4e-2,
the same to two digits with the state walks and with the state scan they replaced; 1.8e-2 at B2 T1000 H8 G2
N64 on the H200 (2026-12-03). bfloat16 operands multiply exactly: 1.9e-3. Every other tensor stays within
3.7e-3 in both dtypes (2.2e-3 over the eight draws)."""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels at real sizes run on a GPU")
@pytest.mark.parametrize("dtype_name", sorted(GPU_DTYPES))
@pytest.mark.parametrize("shape", [(1, 4096, 4, 64, 1, 128), (2, 1000, 8, 64, 2, 64)], ids=shape_id)
def test_triton_path_on_the_gpu_matches_the_recurrence(shape, dtype_name):
    """Real sizes on a GPU (the initial state in float32, as a layer passes it) against the float64 loop:
    outputs, final state and every gradient."""
    dtype, tolerance = GPU_DTYPES[dtype_name]
    inputs, gradients = make_ssd_inputs(*shape, dtype=dtype)
    on_gpu = {name: None if t is None else t.cuda() for name, t in inputs.items()}
    gradients = {name: t.cuda() for name, t in gradients.items()}
    expected = reference(on_gpu, gradients)  # the float64 loop on the GPU: minutes on the CPU at 4K tokens
    actual = run_with_grads(chunk_mamba2, on_gpu, gradients, backend="triton")
    assert_close(actual, expected, tolerance, GPU_HEAD_REDUCTION_TOLERANCE[dtype_name])


def pointwise_inputs(dtype, batch=2, length=70, heads=3, head_dim=24, sliced=True):
    """x as the mixer makes it (a column slice of a wider tensor, unit last stride) unless ``sliced`` is False."""
    wide = torch.randn(batch, length, heads * head_dim + 5, dtype=torch.float64)
    x = wide[..., : heads * head_dim].reshape(batch, length, heads, head_dim)
    if not sliced:
        x = x.contiguous()
    return {
        "x": x.to(dtype),
        "dt": F.softplus(torch.randn(batch, length, heads, dtype=torch.float64)).to(dtype),
        "A": -torch.rand(heads, dtype=torch.float64).to(dtype) - 0.1,
        "o": torch.randn(batch, length, heads, head_dim, dtype=torch.float64).to(dtype),
        "D": torch.randn(heads, dtype=torch.float64).to(dtype),
    }


def pointwise_results(inputs, backend):
    """v, g, the skip's output, and the gradients of x, dt, A, o and D for fixed random output gradients."""
    leaves = {name: tensor.detach().clone().requires_grad_(True) for name, tensor in inputs.items()}
    v, g = ssd_values_and_gates(leaves["x"], leaves["dt"], leaves["A"], backend=backend)
    y = ssd_skip(leaves["o"], leaves["x"], leaves["D"], backend=backend)
    generator = torch.Generator().manual_seed(1)
    loss = sum((out.double() * torch.randn(out.shape, generator=generator, dtype=torch.float64)).sum()
               for out in (v, g, y))
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[name] for name in names])
    return {"v": v.detach(), "g": g.detach(), "y": y.detach(), **{f"d{n}": t for n, t in zip(names, grads)}}


def test_pointwise_ends_have_the_gradients_of_their_formulas_in_float64():
    """The map and the skip (PyTorch path) against torch.autograd.gradcheck's numerical gradients."""
    inputs = pointwise_inputs(torch.float64, batch=1, length=5, heads=2, head_dim=3)
    names = ("x", "dt", "A")
    leaves = [inputs[name].detach().clone().requires_grad_(True) for name in names]
    assert torch.autograd.gradcheck(lambda x, dt, A: ssd_values_and_gates(x, dt, A, backend="torch"), leaves)
    leaves = [inputs[name].detach().clone().requires_grad_(True) for name in ("o", "x", "D")]
    assert torch.autograd.gradcheck(lambda o, x, D: ssd_skip(o, x, D, backend="torch"), leaves)


def test_pointwise_ends_are_the_formulas_they_fuse():
    """v = dt x, g = dt A, y = o + D x in float64, against the formulas written out."""
    inputs = pointwise_inputs(torch.float64)
    results = pointwise_results(inputs, "torch")
    assert relative_error(results["v"], inputs["x"] * inputs["dt"][..., None]) < 1e-15
    assert relative_error(results["g"], inputs["dt"] * inputs["A"]) < 1e-15
    assert relative_error(results["y"], inputs["o"] + inputs["D"][:, None] * inputs["x"]) < 1e-15


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("sliced", [True, False], ids=["column_slice", "contiguous"])
def test_pointwise_triton_kernels_match_the_torch_path(dtype, sliced):
    """Triton's interpreter (elementwise kernels only, so bfloat16 too) against the PyTorch path on the same
    inputs: values, gates, the skip and every gradient, including the per-head sums dA and dD."""
    inputs = pointwise_inputs(dtype, sliced=sliced)
    expected = pointwise_results(inputs, "torch")
    actual = pointwise_results(inputs, "triton")
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    for name in expected:
        assert actual[name].dtype == expected[name].dtype, name
    # dD, like dA, is one float32 sum per head (over B T P terms here) whose order differs between the two paths:
    # 1.07e-6 was seen once in float32
    assert_close(actual, expected, tolerance, head_sums=("dA", "dD"))


def both_ends_backward(inputs, backend, fused):
    """(dx, d dt, dA, dD) of the two ends for random dv, dg, dy: the one-pass backward, or the two passes with
    their dx terms added as autograd adds them."""
    from schedlang.kernels.mamba2.pointwise import pointwise_implementation

    generator = torch.Generator().manual_seed(2)
    x, dt, A, D = (inputs[name] for name in ("x", "dt", "A", "D"))
    dv = torch.randn(x.shape, generator=generator, dtype=torch.float64).to(x.dtype)
    dg = torch.randn(dt.shape, generator=generator, dtype=torch.float64).float()
    dy = torch.randn(x.shape, generator=generator, dtype=torch.float64).to(x.dtype)
    ends = pointwise_implementation(backend, x)
    if fused:
        return ends.map_and_skip_backward(x, dt.float(), A.float(), D.float(), dv, dg, dy)
    dx, ddt, dA = ends.map_backward(x, dt.float(), A.float(), dv, dg)
    skip_dx, dD = ends.skip_backward(x, D.float(), dy)
    return dx + skip_dx, ddt, dA, dD


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_both_ends_backward_in_one_pass_is_the_two_passes(backend, dtype):
    """``map_and_skip_backward`` (what chunk_mamba2's one autograd node runs) against the map's and the skip's
    backward run apart, dx summed: the same gradients, dx now rounded once instead of twice."""
    if backend == "triton" and torch.cuda.is_available():
        pytest.skip("the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
    inputs = pointwise_inputs(dtype)
    fused = both_ends_backward(inputs, backend, fused=True)
    apart = both_ends_backward(inputs, backend, fused=False)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    for name, one, two in zip(("dx", "ddt", "dA", "dD"), fused, apart, strict=True):
        assert one.dtype == two.dtype, name
        assert relative_error(one, two) < tolerance, name


def test_one_autograd_node_has_the_gradients_of_the_composed_operator():
    """chunk_mamba2 with a skip is one autograd node (SsdFunction); its gradients, final-state gradient included,
    are those of the map, simple GLA and the skip composed as separate nodes, in float64."""
    from schedlang.kernels.mamba2 import ssd_skip as skip

    inputs, gradients = make_ssd_inputs(2, 70, 4, 8, 2, 6, torch.float64, True)
    leaves = {name: tensor.detach().clone().requires_grad_(True) for name, tensor in inputs.items()}
    fused, fused_state = chunk_mamba2(**leaves, output_final_state=True, backend="torch")
    assert type(fused.grad_fn).__name__ == "SsdFunctionBackward"
    composed_leaves = {name: tensor.detach().clone().requires_grad_(True) for name, tensor in inputs.items()}
    no_skip = {**composed_leaves, "D": None}
    output, composed_state = chunk_mamba2(**no_skip, output_final_state=True, backend="torch")
    composed = skip(output, composed_leaves["x"], composed_leaves["D"], "torch")
    assert relative_error(fused, composed) < 1e-12
    names = list(leaves)
    grads = []
    for y, state, chosen in ((fused, fused_state, leaves), (composed, composed_state, composed_leaves)):
        loss = (y * gradients["y"]).sum() + (state * gradients["final_state"]).sum()
        grads.append(torch.autograd.grad(loss, [chosen[name] for name in names]))
    for name, one, two in zip(names, *grads, strict=True):
        assert relative_error(one, two) < 1e-12, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
@pytest.mark.parametrize("shape", [(1, 130, 4, 8, 2, 16), (2, 63, 2, 16, 1, 8)], ids=shape_id)
def test_the_ends_run_in_the_chunk_kernels_reading_x_through_its_strides(monkeypatch, shape):
    """On the Triton path the output kernel adds ``D x`` and the dv kernel forms dx, d dt's and dD's x-sized sums
    (no pointwise launch for the skip or for the ends' backward), reading x where it lies: here a column slice of a
    wider tensor, as the mixer's convolution output is. Output, final state and every gradient against the
    float64 loop."""
    from schedlang.kernels.mamba2 import pointwise_triton

    def refuse(*_):
        raise AssertionError("an end ran as a pointwise launch of its own")

    monkeypatch.setattr(pointwise_triton, "skip_forward", refuse)
    monkeypatch.setattr(pointwise_triton, "map_and_skip_backward", refuse)
    inputs, gradients = make_ssd_inputs(*shape, torch.float32)
    batch, length, heads, head_dim = inputs["x"].shape
    wide = torch.randn(batch, length, heads, 3 * head_dim)
    wide[..., head_dim:2 * head_dim] = inputs["x"]
    leaves = {name: None if tensor is None else tensor.detach().clone().requires_grad_(True)
              for name, tensor in inputs.items() if name != "x"}
    wide.requires_grad_(True)
    x = wide[..., head_dim:2 * head_dim]
    assert not x.is_contiguous() and x.stride(-1) == 1
    y, final_state = chunk_mamba2(x, **leaves, output_final_state=True, backend="triton")
    loss = (y.double() * gradients["y"]).sum() + (final_state.double() * gradients["final_state"]).sum()
    present = [name for name in LEAVES if name != "x" and leaves[name] is not None]
    grads = torch.autograd.grad(loss, [wide] + [leaves[name] for name in present])
    actual = {"y": y.detach(), "final_state": final_state.detach(), "dx": grads[0][..., head_dim:2 * head_dim]}
    actual.update({f"d{name}": grad for name, grad in zip(present, grads[1:])})
    assert grads[0][..., :head_dim].abs().max() == 0 and grads[0][..., 2 * head_dim:].abs().max() == 0
    assert_close(actual, reference(inputs, gradients), 2e-5)


def test_an_implementation_without_the_skip_refuses_one():
    """Only an implementation that adds the skip in its own kernel takes one: the PyTorch path says so."""
    from schedlang.kernels.simple_gla.chunk_torch import SIMPLE_GLA

    inputs, _ = make_ssd_inputs(1, 16, 2, 4, 2, 4, torch.float64, False)
    v, g = ssd_values_and_gates(inputs["x"], inputs["dt"], inputs["A"], backend="torch")
    implementation = SIMPLE_GLA.implementation_for("torch", inputs["C"])
    assert not implementation.takes_ssd_ends
    with pytest.raises(ValueError, match="torch implementation does not take"):
        implementation.forward(inputs["C"], inputs["B"], v, g, 1.0, None, skip=(inputs["x"], inputs["D"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: CPU tensors, TRITON_INTERPRET=1")
def test_the_ends_gradients_from_several_value_blocks():
    """With the head width cut into several dv tiles (block_v 16 over P = 48: three), d dt's and dD's partials of
    every tile are summed: every gradient against the float64 loop."""
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.simple_gla import chunk_triton  # noqa: F401 (registers its launch table)

    inputs, gradients = make_ssd_inputs(1, 100, 2, 48, 1, 16, torch.float32)
    with launch_overrides({"simple_gla": {"dv": dict(block_v=16), "output": dict(block_v=16)}}):
        actual = run_with_grads(chunk_mamba2, inputs, gradients, backend="triton")
    assert_close(actual, reference(inputs, gradients), 2e-5)
