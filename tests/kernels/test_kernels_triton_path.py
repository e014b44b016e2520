"""The Triton kernels against the float64 naive recurrence.

On a CPU they run under TRITON_INTERPRET=1 (set by tests/conftest.py) at tiny sizes; on a GPU the same
tests run at real sizes, in float32 (tf32 matrix products) and bfloat16. Outputs are allocated NaN-filled
(tests/kernels/conftest.py), so an element a kernel never writes fails the comparison.
"""

import dataclasses

import pytest
import torch

from kernel_reference_cases import OPERATORS, assert_close, make_inputs, reference, relative_error, run_with_grads

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"

if ON_GPU:
    SHAPES = [(2, 63, 2, 32), (1, 1000, 4, 64), (2, 1000, 2, 128), (1, 2048, 4, 128), (3, 300, 3, 64)]
    DTYPES = {"float32": (torch.float32, 5e-3), "bfloat16": (torch.bfloat16, 3e-2)}
else:
    SHAPES = [(1, 63, 2, 32), (2, 130, 1, 16)]
    # float32 in the interpreter under 'strong' decay (in-chunk gate sums of -256 and more): over 30 fresh draws
    # simple_gla's Triton final state and dg reached 1.14e-5 relative (its torch path 3.3e-6, gla's Triton path
    # 2.3e-6), so a 1e-5 bound failed now and then; 5e-5 keeps a 4x margin over the worst draw seen
    DTYPES = {"float32": (torch.float32, 5e-5)}


def shape_id(shape):
    return "B{}-T{}-H{}-D{}".format(*shape)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("decay, random_initial_state", [("weak", False), ("strong", True)], ids=["weak-zero_state", "strong-random_state"])
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_triton_path_matches_naive_recurrence(operator_name, shape, decay, random_initial_state, dtype_name):
    operator = OPERATORS[operator_name]
    dtype, tolerance = DTYPES[dtype_name]
    inputs = make_inputs(operator, *shape, decay, random_initial_state, dtype, DEVICE)
    expected = reference(operator, inputs)
    actual = run_with_grads(operator.chunked, inputs, backend="triton")
    assert actual["o"].dtype == dtype and actual["final_state"].dtype == torch.float32
    assert_close(actual, expected, tolerance)


KEY_VALUE_SHAPES = [(1, 2048, 4, 128, 64), (2, 1000, 2, 64, 128)] if ON_GPU else [(1, 63, 2, 32, 16)]
"""(batch, length, heads, key width, value width): keys and values of different widths, as Mamba-2's SSD hands
simple GLA its state rows N and head width P."""


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
@pytest.mark.parametrize("shape", KEY_VALUE_SHAPES, ids=lambda shape: "B{}-T{}-H{}-K{}-V{}".format(*shape))
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_triton_path_with_keys_and_values_of_different_widths(operator_name, shape, dtype_name):
    operator = OPERATORS[operator_name]
    dtype, tolerance = DTYPES[dtype_name]
    batch, length, heads, key_dim, value_dim = shape
    inputs = make_inputs(operator, batch, length, heads, key_dim, "weak", True, dtype, DEVICE, value_dim=value_dim)
    expected = reference(operator, inputs)
    actual = run_with_grads(operator.chunked, inputs, backend="triton")
    assert actual["o"].shape[-1] == value_dim and actual["final_state"].shape[-2:] == (key_dim, value_dim)
    assert_close(actual, expected, tolerance)


GROUPED_SHAPES = (
    [(2, 1000, 8, 2, 64), (1, 2048, 16, 1, 128), (1, 300, 4, 4, 64)] if ON_GPU
    else [(2, 100, 4, 2, 16), (1, 63, 4, 1, 32), (1, 130, 4, 4, 16)]
)
"""(batch, length, heads, q/k groups, width): q and k read by G groups of heads, G = H included."""


@pytest.mark.parametrize("shape", GROUPED_SHAPES, ids=lambda shape: "B{}-T{}-H{}-G{}-D{}".format(*shape))
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_grouped_queries_match_the_recurrence_on_repeated_heads(shape, backend, dtype_name):
    """chunk_simple_gla with q, k [B, T, G, K] against the float64 recurrence on q and k repeated per
    head: outputs, final state and every gradient, dq and dk summed over each group's heads."""
    from schedlang.kernels.common.heads import repeat_each_head
    from schedlang.kernels.simple_gla import naive_recurrent_simple_gla
    from schedlang.kernels.simple_gla import chunk_simple_gla

    batch, length, heads, groups, dim = shape
    dtype, tolerance = DTYPES[dtype_name]
    inputs = make_inputs(OPERATORS["simple_gla"], batch, length, heads, dim, "strong", True, dtype, DEVICE)
    narrow = {name: getattr(inputs, name)[:, :, :groups].contiguous() for name in ("q", "k")}
    inputs = dataclasses.replace(inputs, **narrow)

    def repeated(q, k, v, g, **kwargs):
        return naive_recurrent_simple_gla(repeat_each_head(q, heads), repeat_each_head(k, heads), v, g, **kwargs)

    as64 = dataclasses.replace(
        inputs, **{name: getattr(inputs, name).double() for name in ("q", "k", "v", "g", "initial_state")}
    )
    actual = run_with_grads(chunk_simple_gla, inputs, backend=backend)
    assert actual["dq"].shape == inputs.q.shape and actual["dk"].shape == inputs.k.shape
    assert_close(actual, run_with_grads(repeated, as64), tolerance)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_triton_path_chained_over_pieces_matches_the_reference(operator_name):
    operator = OPERATORS[operator_name]
    length = 1000 if ON_GPU else 150
    cuts = [100, 513, 640, 900] if ON_GPU else [40, 64, 129]
    dtype, tolerance = DTYPES["float32"]
    inputs = make_inputs(operator, 1, length, 2, 32, "strong", True, dtype, DEVICE)

    def pieces(q, k, v, g, initial_state=None, output_final_state=True):
        outputs, state = [], initial_state
        bounds = [0, *cuts, length]
        for start, end in zip(bounds[:-1], bounds[1:]):
            output, state = operator.chunked(
                q[:, start:end], k[:, start:end], v[:, start:end], g[:, start:end],
                initial_state=state, output_final_state=True, backend="triton",
            )
            outputs.append(output)
        return torch.cat(outputs, dim=1), state

    assert_close(run_with_grads(pieces, inputs), reference(operator, inputs), tolerance)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_triton_path_stays_finite_and_exact_under_extreme_gates(operator_name):
    """Log-gates of -30 on a third of the tokens (or key dimensions) and a padded last chunk: a chunk's decay
    then spans far more than float32's exponent range, so any factor formed as exp(-gc) or from a padded
    token's zero gate overflows; the kernels must never form one. The cumulative gate reaches about -300
    inside a chunk, where float32 keeps it to ~3e-5 absolute: hence the looser bound on the CPU."""
    operator = OPERATORS[operator_name]
    dtype, tolerance = DTYPES["float32"]
    tolerance = max(tolerance, 1e-4)
    inputs = make_inputs(operator, 1, 100, 2, 32, "strong", True, dtype, DEVICE, generator_seed=7)
    gate = inputs.g.clone()
    if operator.gate_per_key:
        gate[:, ::3, :, ::2] = -30.0
    else:
        gate[:, ::3] = -30.0
    inputs = dataclasses.replace(inputs, g=gate)
    assert_close(run_with_grads(operator.chunked, inputs, backend="triton"), reference(operator, inputs), tolerance)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_auto_backend_picks_triton_here(operator_name):
    """With TRITON_INTERPRET=1 on a CPU, or on a GPU, "auto" runs the Triton kernels: same numbers as "triton"."""
    operator = OPERATORS[operator_name]
    inputs = make_inputs(operator, 1, 70, 1, 32, "weak", True, torch.float32, DEVICE)
    automatic, _ = operator.chunked(inputs.q, inputs.k, inputs.v, inputs.g, initial_state=inputs.initial_state)
    forced, _ = operator.chunked(inputs.q, inputs.k, inputs.v, inputs.g, initial_state=inputs.initial_state, backend="triton")
    plain, _ = operator.chunked(inputs.q, inputs.k, inputs.v, inputs.g, initial_state=inputs.initial_state, backend="torch")
    assert torch.equal(automatic, forced)
    assert relative_error(forced, plain) < (5e-3 if ON_GPU else 1e-5)


def _chunk_gate_spans(g: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Per chunk, the widest range of the chunk-local cumulative gate over any head and key."""
    spans = []
    for start in range(0, g.shape[1], chunk):
        cumulative = g[:, start : start + chunk].double().cumsum(1)
        spans.append((cumulative.amax(1) - cumulative.amin(1)).amax())
    return torch.stack(spans)


@pytest.mark.parametrize(
    "decay, span_limit, expect",
    [("weak", 1e30, "smooth"), ("weak", -1.0, "steep"), ("strong", None, "both")],
    ids=["all-smooth", "all-steep", "mixed"],
)
def test_gla_smooth_and_steep_chunk_paths_each_match_the_reference(monkeypatch, decay, span_limit, expect):
    """GLA takes one of two paths per chunk: one-reference matrix products where the cumulative gate spans
    at most SPAN_LIMIT (smooth), the exact sub-chunk kernels elsewhere (steep). Forcing each path, and a
    mix within one call, must give the reference; outputs are NaN-poisoned, so a chunk neither path wrote
    fails."""
    from schedlang.kernels.gla import chunk_triton

    if span_limit is not None:
        monkeypatch.setattr(chunk_triton, "SPAN_LIMIT", span_limit)
    operator = OPERATORS["gla"]
    length = 1000 if ON_GPU else 200
    dtype, tolerance = DTYPES["float32"]
    inputs = make_inputs(operator, 1, length, 2, 32, decay, True, dtype, DEVICE, generator_seed=3)
    spans = _chunk_gate_spans(inputs.g.cpu())
    smooth = int((spans <= chunk_triton.SPAN_LIMIT).sum())
    counts = {"smooth": (len(spans), 0), "steep": (0, len(spans))}
    if expect == "both":
        assert 0 < smooth < len(spans), f"the strong-decay inputs should mix both kinds of chunk: spans {spans}"
    else:
        assert (smooth, len(spans) - smooth) == counts[expect]
    assert_close(run_with_grads(operator.chunked, inputs, backend="triton"), reference(operator, inputs), tolerance)


@pytest.mark.parametrize(
    "entry, overrides",
    [
        ("smooth_dqkg", dict(key_splits=2, block_k=16)),
        ("smooth_dqkg", dict(key_splits=4, block_k=16, block_v=32)),
        ("smooth_output", dict(block_k=16, block_v=16)),
        ("smooth_dv", dict(block_k=16, block_v=16)),
        ("updates", dict(block_k=16)),
        ("updates_with_gradients", dict(block_k=16)),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(f"{k}{v}" for k, v in value.items()),
)
def test_gla_launch_table_variants_stay_exact(monkeypatch, entry, overrides):
    """benchmarks/tune_kernels.py sweeps chunk_triton.LAUNCH: every tile and split it may pick must give the
    reference, on mixed smooth and steep chunks, with steep groups (STEEP_GROUP = 4, 3 chunks a head) that straddle heads."""
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.gla import chunk_triton

    monkeypatch.setattr(chunk_triton, "STEEP_GROUP", 4)
    operator = OPERATORS["gla"]
    dtype, tolerance = DTYPES["float32"]
    inputs = make_inputs(operator, 1, 1000 if ON_GPU else 180, 2, 64, "strong", True, dtype, DEVICE, generator_seed=5)
    spans = _chunk_gate_spans(inputs.g.cpu())
    assert 0 < int((spans <= chunk_triton.SPAN_LIMIT).sum()) < len(spans)
    with launch_overrides({"gla": {entry: overrides}}):
        assert_close(run_with_grads(operator.chunked, inputs, backend="triton"), reference(operator, inputs), tolerance)


@pytest.mark.parametrize("operator_name", ["gla"])
@pytest.mark.parametrize("length", [40, 130, 1000 if ON_GPU else 300])
@pytest.mark.parametrize(
    "scan",
    [dict(prefetch=0), dict(prefetch=1), dict(prefetch=1, block_k=8, block_v=16), dict(pair_max_chunks=0)],
    ids=["no_prefetch", "prefetch", "prefetch-8x16", "separate_backward_scans"],
)
def test_scan_variants_stay_exact(operator_name, length, scan):
    """Both loops of the state scan (operands loaded three steps ahead, or each step's own), over fewer chunks
    than the prefetch depth (1 and 3 chunks) and many, with an initial state and a final-state gradient; and
    the backward's two scans as one launch or two ([Note: paired scans])."""
    from schedlang.kernels.common import triton_scan  # noqa: F401 (registers the scan's launch table)
    from schedlang.kernels.common.launch_tables import launch_overrides

    operator = OPERATORS[operator_name]
    dtype, tolerance = DTYPES["float32"]
    inputs = make_inputs(operator, 2, length, 2, 32, "weak", True, dtype, DEVICE, generator_seed=11)
    with launch_overrides({"scan": {"scan": scan}}):
        assert_close(run_with_grads(operator.chunked, inputs, backend="triton"), reference(operator, inputs), tolerance)


@pytest.mark.parametrize("length", [40, 130, 1000 if ON_GPU else 300])
@pytest.mark.parametrize(
    "walk",
    [dict(block_k=16, block_v=16, min_block=16), dict(block_k=32, block_v=16, min_block=16, num_stages=1),
     dict(min_block=16)],
    ids=["16x16", "32x16-one_stage", "halved_to_16"],
)
@pytest.mark.parametrize("key_value", [(32, 32), (32, 48)], ids=["K32-V32", "K32-V48"])
def test_simple_gla_walk_tiles_stay_exact(length, walk, key_value):
    """Simple GLA's state walks over several key and value tiles (a value width no tile divides included), over
    fewer chunks than a tile's pipeline and many, with an initial state and a final-state gradient; the third
    case lets walk_tiles halve the tiles to fill the GPU's multiprocessors."""
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.simple_gla import chunk_triton  # noqa: F401 (registers simple GLA's launch table)

    operator = OPERATORS["simple_gla"]
    dtype, tolerance = DTYPES["float32"]
    key_dim, value_dim = key_value
    inputs = make_inputs(operator, 2, length, 2, key_dim, "weak", True, dtype, DEVICE, generator_seed=11,
                         value_dim=value_dim)
    with launch_overrides({"simple_gla": {"walk": walk}}):
        assert_close(run_with_grads(operator.chunked, inputs, backend="triton"), reference(operator, inputs), tolerance)


@pytest.mark.parametrize(
    "sizes, expected",
    [
        ((128, 128, 256), (64, 64)),  # 2 x 2 x 256 programs: full tiles fill the GPU
        ((128, 128, 32), (64, 32)),  # 2 x 2 x 32 = 128 < 132: the value edge halves first
        ((128, 64, 16), (32, 32)),  # 2 x 1 x 16: value then key edge halve, down to min_block
        ((16, 16, 1), (16, 16)),  # widths below min_block keep tiles of their own size
    ],
)
def test_walk_tiles_halve_until_the_launch_fills_the_gpu(sizes, expected):
    from schedlang.kernels.simple_gla.state_walks import walk_tiles

    key_dim, value_dim, walks = sizes
    launch = dict(block_k=64, block_v=64, min_block=32)
    assert walk_tiles(key_dim, value_dim, walks, torch.device("cpu"), launch) == expected


SAVED_STATES_RECOMPUTATION = {
    "gla": ("schedlang.kernels.common.triton_scan", "chunk_state_scan_pair", lambda *args, **kwargs: True, False),
    "simple_gla": ("schedlang.kernels.simple_gla.chunk_triton", "state_walks",
                   lambda *args, **kwargs: kwargs.get("reverse") is not None and kwargs.get("forward") is not None,
                   True),
}
"""operator -> (module, function, whether a call of it recomputes the forward's states in a backward, whether
the backward with saved states calls it at all)."""


@pytest.mark.parametrize("operator_name", ["gla", "simple_gla"])
@pytest.mark.parametrize("decay", ["weak", "strong"])
@pytest.mark.parametrize("length", [40, 1000 if ON_GPU else 200])
def test_saved_states_skip_the_recomputation_and_change_no_result(monkeypatch, operator_name, decay, length):
    """save_states: the backward takes the forward's chunk states (no state recomputation: gla's paired scan
    and simple GLA's forward walk beside the reverse one never run) and every gradient still matches the
    float64 recurrence, with a state in and out."""
    import importlib

    module_name, function_name, recomputes, called = SAVED_STATES_RECOMPUTATION[operator_name]
    module = importlib.import_module(module_name)
    original = getattr(module, function_name)
    calls = []

    def must_not_recompute(*args, **kwargs):
        if recomputes(*args, **kwargs):
            raise AssertionError("the backward recomputed the states although the forward saved them")
        calls.append(function_name)
        return original(*args, **kwargs)

    operator = OPERATORS[operator_name]
    dtype, tolerance = DTYPES["float32"]
    inputs = make_inputs(operator, 2, length, 2, 32, decay, True, dtype, DEVICE, generator_seed=13)
    recomputed = run_with_grads(operator.chunked, inputs, backend="triton")
    monkeypatch.setattr(module, function_name, must_not_recompute)
    results = run_with_grads(operator.chunked, inputs, backend="triton", save_states=True)
    assert bool(calls) == called
    assert_close(results, reference(operator, inputs), tolerance)
    # the same kernels on the same operands: the saved states are the ones the backward would recompute
    assert_close(results, recomputed, 1e-6)


def test_saved_states_are_ignored_by_the_torch_path():
    operator = OPERATORS["gla"]
    inputs = make_inputs(operator, 1, 100, 2, 16, "weak", True, torch.float64, "cpu", generator_seed=3)
    saved = run_with_grads(operator.chunked, inputs, backend="torch", save_states=True)
    assert_close(saved, run_with_grads(operator.chunked, inputs, backend="torch"), 1e-12)


def test_gla_in_float16_keeps_its_gated_operands_finite():
    """float16 overflows at 65504: a chunk whose cumulative gate spans ~38 (log-gate -0.6 a token) would put
    factors of exp(19) on the keys if it took the smooth path with the bfloat16 limit. Keys of size ~30 and
    float16 inputs must still give finite results that match the float64 recurrence."""
    from schedlang.kernels.gla import chunk_triton

    operator = OPERATORS["gla"]
    inputs = make_inputs(operator, 1, 130, 1, 16, "weak", True, torch.float64, DEVICE, generator_seed=5)
    inputs = dataclasses.replace(
        inputs, k=inputs.k * 30, g=torch.full_like(inputs.g, -0.6)
    )
    as_half = dataclasses.replace(
        inputs, **{name: getattr(inputs, name).to(torch.float16) for name in ("q", "k", "v", "g", "output_grad")}
    )
    assert chunk_triton.smooth_span_limit(torch.float16) < 0.6 * 63 < chunk_triton.smooth_span_limit(torch.bfloat16)
    actual = run_with_grads(operator.chunked, as_half, backend="triton")
    assert_close(actual, reference(operator, as_half), 2e-2)


@pytest.mark.parametrize("operator_name", sorted(OPERATORS))
def test_triton_backward_without_a_final_state_gradient(operator_name):
    """No gradient flows into the final state (output_final_state=False): the backward's reverse scan starts
    from zero while the forward scan, in the same launch, starts from the initial state."""
    operator = OPERATORS[operator_name]
    dtype, tolerance = DTYPES["float32"]
    inputs = make_inputs(operator, 1, 150, 2, 32, "strong", True, dtype, DEVICE, generator_seed=11)

    def gradients(function, as_dtype, **kwargs):
        leaves = [tensor.detach().to(as_dtype).requires_grad_(True) for tensor in inputs.leaves()]
        output, final_state = function(*leaves[:4], initial_state=leaves[4], output_final_state=False, **kwargs)
        assert final_state is None
        loss = (output.double() * inputs.output_grad.double()).sum()
        return dict(zip(["dq", "dk", "dv", "dg", "d_initial_state"], torch.autograd.grad(loss, leaves)))

    actual = gradients(operator.chunked, dtype, backend="triton")
    expected = gradients(operator.naive, torch.float64)
    assert_close(actual, expected, tolerance)
