"""The chunked gated delta rule against the token-by-token recurrence and against autograd of its PyTorch path:
batched PyTorch around a Python state pass (backend="torch"), or the Triton kernels of kernels/gdn/chunk_triton.py
with their hand-derived backward (backend="triton"; the interpreter on a CPU, real sizes and bfloat16 on a GPU).
Kernel outputs are NaN-filled first (tests/kernels/conftest.py).

SCHEDLANG_TEST_GDN_OVERLAP=<split> (a fraction in (0, 1)) runs every test of this module under the two-segment
overlap schedule ([Note: gdn overlap]) with that split, so the whole module checks it on a GPU's streams."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from schedlang.kernels import chunk_gated_delta_rule
from schedlang.kernels.common import to_chunks
from schedlang.kernels.gdn import naive_recurrent_gated_delta_rule

GRADIENT_NAMES = ["dq", "dk", "dv", "dg", "dbeta", "d_initial_state"]
FORCED_OVERLAP_SPLIT = os.environ.get("SCHEDLANG_TEST_GDN_OVERLAP")


@pytest.fixture(autouse=True)
def forced_overlap():
    """Every test under the two-segment schedule when SCHEDLANG_TEST_GDN_OVERLAP names a split, else as is."""
    if FORCED_OVERLAP_SPLIT is None:
        yield
        return
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.gdn import state_pass_triton  # noqa: F401  (registers the "gdn" launch table)

    with launch_overrides({"gdn": {"overlap": {"segments": 2, "split": float(FORCED_OVERLAP_SPLIT)}}}):
        yield


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


def run_with_grads(function, inputs, upstream, use_output=True, use_final_state=True, **kwargs):
    names = [name for name in ("q", "k", "v", "g", "beta", "initial_state") if inputs[name] is not None]
    leaves = {name: inputs[name].detach().clone().requires_grad_(True) for name in names}
    output, final_state = function(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
        initial_state=leaves.get("initial_state"), output_final_state=True, **kwargs,
    )
    loss = 0.0
    if use_output:
        loss = loss + (output.double() * upstream["o"]).sum()
    if use_final_state:
        loss = loss + (final_state.double() * upstream["final_state"]).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    grads = [torch.zeros_like(leaf) if grad is None else grad for leaf, grad in zip(leaves.values(), grads)]
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


ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
if ON_GPU:
    TRITON_SHAPES = [(2, 63, 2, 32), (2, 1000, 2, 128), (1, 2048, 4, 128), (3, 300, 3, 64), (1, 4096, 2, 64)]
    TRITON_DTYPES = {"float32": (torch.float32, 1e-4), "bfloat16": (torch.bfloat16, 3e-2)}
else:
    TRITON_SHAPES = [(1, 63, 2, 16), (2, 130, 1, 32), (1, 70, 1, 64)]
    TRITON_DTYPES = {"float32": (torch.float32, 1e-4)}


def on_device(inputs, dtype):
    """The inputs in ``dtype`` on DEVICE, the initial state kept in float32 (as a layer passes it)."""
    moved = {name: None if t is None else t.to(DEVICE, dtype) for name, t in inputs.items()}
    if moved["initial_state"] is not None:
        moved["initial_state"] = moved["initial_state"].float()
    return moved


@pytest.mark.parametrize("shape", TRITON_SHAPES, ids=lambda s: "B{}-T{}-H{}-D{}".format(*s))
@pytest.mark.parametrize("decay, random_state", [("weak", False), ("strong", True)], ids=["weak-zero_state", "strong-random_state"])
@pytest.mark.parametrize("dtype_name", sorted(TRITON_DTYPES))
def test_triton_path_matches_the_recurrence(shape, decay, random_state, dtype_name):
    dtype, tolerance = TRITON_DTYPES[dtype_name]
    inputs, upstream = make_inputs(*shape, decay, random_state, torch.float64, seed=sum(shape) + 1)
    expected = run_with_grads(naive_recurrent_gated_delta_rule, inputs, upstream)
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    actual = run_with_grads(chunk_gated_delta_rule, on_device(inputs, dtype), on_device_upstream, backend="triton")
    assert_close({name: t.cpu() for name, t in actual.items()}, expected, tolerance)


TRITON_AGAINST_TORCH = [(1, 100, 2, 32, True), (2, 64, 1, 16, False)] if not ON_GPU else [(2, 1500, 3, 128, True), (1, 777, 2, 64, False)]


@pytest.mark.parametrize("save_states", [False, True], ids=["recompute_states", "save_states"])
@pytest.mark.parametrize("case", TRITON_AGAINST_TORCH, ids=lambda c: "B{}-T{}-H{}-D{}-{}".format(*c[:4], "state" if c[4] else "no_state"))
def test_triton_backward_matches_autograd_of_the_torch_path(case, save_states):
    """The hand-derived backward against autograd through the batched PyTorch path in float64: the output, the
    final state and every gradient (q, k, v, g, beta and the initial state), with and without kept states."""
    *shape, random_state = case
    inputs, upstream = make_inputs(*shape, "strong", random_state, torch.float64, seed=sum(shape) + 5)
    expected = run_with_grads(chunk_gated_delta_rule, inputs, upstream, backend="torch")
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    actual = run_with_grads(
        chunk_gated_delta_rule, on_device(inputs, torch.float32), on_device_upstream, backend="triton",
        save_states=save_states,
    )
    assert_close({name: t.cpu() for name, t in actual.items()}, expected, 1e-4)


SPLIT_LAUNCHES = [
    {"split": 1},
    {"split": 1, "block_k": 32, "block_v": 16},
    {"split": 0, "block_k": 32, "block_v": 16},
    {"split": 1, "transpose_scores": 1},
    {"split": 1, "block_k": 32, "block_v": 16, "transpose_scores": 1},
]


@pytest.mark.parametrize("launch", SPLIT_LAUNCHES, ids=lambda l: "-".join(f"{k}{v}" for k, v in l.items()))
def test_per_chunk_backward_layouts_give_the_same_gradients(launch):
    """The per-chunk backward fused or split in two kernels, with several key blocks per head (partial dT, dbeta
    and dg summed across them), against the recurrence in float64: every gradient and the final state."""
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.gdn import state_pass_triton  # noqa: F401  (registers the "gdn" launch table)

    inputs, upstream = make_inputs(1, 150, 2, 64, "strong", True, torch.float64, seed=41)
    expected = run_with_grads(naive_recurrent_gated_delta_rule, inputs, upstream)
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    with launch_overrides({"gdn": {"chunk_gradients": launch}}):
        actual = run_with_grads(
            chunk_gated_delta_rule, on_device(inputs, torch.float32), on_device_upstream, backend="triton",
        )
    assert_close({name: t.cpu() for name, t in actual.items()}, expected, 1e-4)


@pytest.mark.parametrize("segments", [1, 2], ids=["one_segment", "two_segments"])
def test_the_backward_state_pass_can_form_the_output_terms_itself(segments):
    """With the launch table's backward "output_terms" the output-terms kernel writes no entering-state gradients
    for 16-bit inputs and the backward state pass forms them from q and dO: every gradient still matches the
    float64 recurrence, in one segment and in the two-segment overlap; float32 inputs keep reading them."""
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.gdn import chunk_triton, state_pass_triton  # noqa: F401  (registers the "gdn" launch table)

    inputs, upstream = make_inputs(2, 150, 2, 32, "strong", True, torch.float64, seed=47)
    expected = run_with_grads(naive_recurrent_gated_delta_rule, inputs, upstream)
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    table = {"backward": {"output_terms": 1}, "overlap": {"segments": segments}}
    formed = []
    original = chunk_triton.output_gradients

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        formed.append(result[0])
        return result

    with launch_overrides({"gdn": table}), pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunk_triton, "output_gradients", spy)
        single = run_with_grads(chunk_gated_delta_rule, on_device(inputs, torch.float32), on_device_upstream, backend="triton")
        assert formed and all(entering is not None and from_outputs is None for entering, from_outputs in formed)
        formed.clear()
        half = run_with_grads(chunk_gated_delta_rule, on_device(inputs, torch.float16), on_device_upstream, backend="triton")
    assert formed and all(entering is None and from_outputs is not None for entering, from_outputs in formed)
    assert_close({name: t.cpu() for name, t in single.items()}, expected, 1e-4)
    assert_close({name: t.double().cpu() for name, t in half.items()}, expected, 3e-3)


def test_stored_value_operands_give_16_bit_inputs_the_same_gradients():
    """16-bit inputs: the split backward's value loop with its operands as stored gives the gradients it gives with
    them converted to float32 (the same products), and the choice reaches the kernel only for one 16-bit dtype."""
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.gdn import chunk_triton, state_pass_triton  # noqa: F401  (registers the "gdn" launch table)

    stored = {"value_operands": "stored"}
    half, single = torch.zeros(1, dtype=torch.float16), torch.zeros(1)
    assert chunk_triton.value_operands_as_stored(stored, half, half)
    assert not chunk_triton.value_operands_as_stored(stored, half, single)
    assert not chunk_triton.value_operands_as_stored(stored, single, single)
    assert not chunk_triton.value_operands_as_stored({"value_operands": "float32"}, half, half)
    inputs, upstream = make_inputs(1, 150, 2, 64, "strong", True, torch.float64, seed=43)
    expected = run_with_grads(naive_recurrent_gated_delta_rule, inputs, upstream)
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    results = {}
    for operands in ("float32", "stored"):
        with launch_overrides({"gdn": {"chunk_gradients": {"split": 1, "value_operands": operands}}}):
            results[operands] = run_with_grads(
                chunk_gated_delta_rule, on_device(inputs, torch.float16), on_device_upstream, backend="triton",
            )
    for name in expected:
        converted, as_stored = (results[operands][name].double().cpu() for operands in ("float32", "stored"))
        assert relative_error(as_stored, converted) < 1e-3, name
        assert relative_error(as_stored, expected[name]) < 3e-3, name


@pytest.mark.parametrize("key_dim, value_dim", [(16, 48), (48, 16)], ids=["K16-V48", "K48-V16"])
def test_triton_path_takes_a_value_dim_unlike_the_key_dim(key_dim, value_dim):
    """V = 2K is Gated DeltaNet's usual head shape; neither dimension need be a power of two."""
    inputs, upstream = make_inputs(1, 80, 2, key_dim, "strong", True, torch.float64, seed=value_dim)
    wide, wide_upstream = make_inputs(1, 80, 2, value_dim, "strong", True, torch.float64, seed=key_dim)
    generator = torch.Generator().manual_seed(3)
    inputs["v"] = wide["v"]
    inputs["initial_state"] = torch.randn(1, 2, key_dim, value_dim, generator=generator, dtype=torch.float64)
    upstream = {"o": wide_upstream["o"], "final_state": torch.randn(1, 2, key_dim, value_dim, generator=generator, dtype=torch.float64)}
    expected = run_with_grads(naive_recurrent_gated_delta_rule, inputs, upstream)
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    actual = run_with_grads(chunk_gated_delta_rule, on_device(inputs, torch.float32), on_device_upstream, backend="triton")
    assert_close({name: t.cpu() for name, t in actual.items()}, expected, 1e-4)


GROUPED_CASES = [(1, 100, 1, 3, 16), (2, 70, 2, 4, 32)] if not ON_GPU else [(1, 1000, 2, 8, 128), (2, 300, 4, 8, 64)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", GROUPED_CASES, ids=lambda c: "B{}-T{}-Hq{}-H{}-D{}".format(*c))
def test_grouped_queries_read_their_q_k_head(case, backend):
    """q and k with fewer heads than v (grouped value heads): value head j reads q/k head j // (H / H_q), and q/k
    gradients are the sums over the value heads each served; against the recurrence on explicitly repeated q and k
    (float64), outputs, final state and every gradient, q's and k's at their narrow width."""
    batch, length, query_heads, heads, dim = case
    inputs, upstream = make_inputs(batch, length, heads, dim, "strong", True, torch.float64, seed=sum(case))
    for name in ("q", "k"):
        inputs[name] = inputs[name][:, :, :query_heads].contiguous()
    groups = heads // query_heads

    def repeated_reference(q, k, v, g, beta, **options):
        return naive_recurrent_gated_delta_rule(
            q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2), v, g, beta, **options
        )

    expected = run_with_grads(repeated_reference, inputs, upstream)
    if backend == "torch":  # float64 throughout
        actual, tolerance = run_with_grads(chunk_gated_delta_rule, inputs, upstream, backend=backend), 1e-10
    else:
        on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
        actual = run_with_grads(
            chunk_gated_delta_rule, on_device(inputs, torch.float32), on_device_upstream, backend=backend
        )
        tolerance = 1e-4
    assert actual["dq"].shape == actual["dk"].shape == (batch, length, query_heads, dim)
    assert_close({name: t.cpu() for name, t in actual.items()}, expected, tolerance)


def test_grouped_queries_must_divide_the_value_heads():
    inputs, _ = make_inputs(1, 10, 3, 16, "weak", False, torch.float32, seed=2)
    q, k = inputs["q"][:, :, :2], inputs["k"][:, :, :2]
    with pytest.raises(ValueError, match="a multiple of q's 2 heads"):
        chunk_gated_delta_rule(q, k, inputs["v"], inputs["g"], inputs["beta"])


def test_the_wy_solve_inverts_each_chunk():
    """T = (I + A)^-1 chunk by chunk, with A = strictly-lower(beta D o K K^T), against torch.linalg.inv in float64,
    on a sequence that ends inside a chunk (the padded rows of T are identity rows)."""
    from schedlang.kernels.gdn.chunk_triton import CHUNK, solve_chunks

    inputs, _ = make_inputs(1, 150, 2, 32, "strong", False, torch.float64, seed=9)
    k, g, beta = (to_chunks(inputs[name], CHUNK, torch.float64) for name in ("k", "g", "beta"))
    gc = g.cumsum(-1)
    strictly_lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool).tril(-1)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~strictly_lower, float("-inf")).exp()
    lower = torch.eye(CHUNK, dtype=torch.float64) + beta[..., None] * decay * (k @ k.transpose(-1, -2))
    device_inputs = on_device(inputs, torch.float32)
    solved = solve_chunks(device_inputs["k"], device_inputs["g"], device_inputs["beta"])
    assert relative_error(solved.inverse.cpu(), torch.linalg.inv(lower)) < 1e-5
    assert relative_error(solved.gate_cumsum.cpu(), gc) < 1e-6
    assert relative_error(solved.chunk_decay.cpu(), gc[..., -1].exp()) < 1e-6


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("used", ["output_only", "final_state_only"])
def test_one_output_unused_gives_the_same_gradients_as_the_recurrence(backend, used):
    """The state pass's backward with no gradient for the final state, or none for the output (so none for
    the entering states and corrections either)."""
    inputs, upstream = make_inputs(1, 150, 2, 16, "weak", True, torch.float32, seed=21)
    as64 = {name: t.double() for name, t in inputs.items()}
    flags = {"use_output": used == "output_only", "use_final_state": used == "final_state_only"}
    expected = run_with_grads(naive_recurrent_gated_delta_rule, as64, upstream, **flags)
    on_device = [{name: t.to(DEVICE) for name, t in tensors.items()} for tensors in (inputs, upstream)]
    actual = run_with_grads(chunk_gated_delta_rule, *on_device, backend=backend, **flags)
    actual = {name: t.cpu() for name, t in actual.items()}
    del expected["o"], expected["final_state"], actual["o"], actual["final_state"]
    assert_close(actual, expected, 1e-4)


def test_invalid_arguments_raise_value_error():
    inputs, _ = make_inputs(1, 10, 2, 16, "weak", False, torch.float32, seed=1)
    q, k, v, g, beta = (inputs[name] for name in ("q", "k", "v", "g", "beta"))
    with pytest.raises(ValueError, match="beta must be"):
        chunk_gated_delta_rule(q, k, v, g, beta[:, :5])
    with pytest.raises(ValueError, match="backend must be one of"):
        chunk_gated_delta_rule(q, k, v, g, beta, backend="cuda")
    with pytest.raises(ValueError, match="g must have shape"):
        chunk_gated_delta_rule(q, k, v, g[..., None].expand(-1, -1, -1, 16), beta)


def overlap_launch(split):
    from schedlang.kernels.gdn import state_pass_triton  # noqa: F401  (registers the "gdn" launch table)

    return {"gdn": {"overlap": {"segments": 2, "split": split}}}


OVERLAP_SHAPE = (2, 1500, 3, 128) if ON_GPU else (1, 200, 2, 16)


@pytest.mark.parametrize("split", [0.01, 0.5, 0.9], ids=lambda s: f"split{s}")
@pytest.mark.parametrize("with_state", [False, True], ids=["no_state", "state_in_out"])
@pytest.mark.parametrize("save_states", [False, True], ids=["recompute_states", "save_states"])
def test_two_segment_overlap_matches_the_recurrence(split, with_state, save_states):
    """The two-segment schedule ([Note: gdn overlap]) against the recurrence in float64: the output, the final
    state and every gradient, with the first segment one kernel chunk long (split 0.01), half and most of the
    chunks, with and without an initial state and a final-state gradient, with kept and with replayed states."""
    from schedlang.kernels.common.launch_tables import launch_overrides

    inputs, upstream = make_inputs(*OVERLAP_SHAPE, "strong", with_state, torch.float64, seed=int(split * 100) + 7)
    flags = {"use_final_state": with_state}
    expected = run_with_grads(naive_recurrent_gated_delta_rule, inputs, upstream, **flags)
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    with launch_overrides(overlap_launch(split)):
        actual = run_with_grads(
            chunk_gated_delta_rule, on_device(inputs, torch.float32), on_device_upstream, backend="triton",
            save_states=save_states, **flags,
        )
    if not with_state:
        del expected["final_state"], actual["final_state"]
    assert_close({name: t.cpu() for name, t in actual.items()}, expected, 1e-4)


@pytest.mark.parametrize("save_states", [False, True], ids=["recompute_states", "save_states"])
def test_the_second_segment_starts_from_the_first_segments_final_state(monkeypatch, save_states):
    """With the first segment one kernel chunk long, the second segment's forward state pass starts from the state
    the first one leaves (the recurrence's state after 64 tokens), the backward state pass of the first segment
    from the gradient the second one leaves, and each covers its own chunks; the replay (without kept states)
    covers all of them."""
    from schedlang.kernels.common.launch_tables import launch_overrides
    from schedlang.kernels.gdn import chunk_triton
    from schedlang.kernels.gdn.overlap import Segment

    inputs, upstream = make_inputs(1, 200, 2, 16, "strong", True, torch.float64, seed=13)
    calls = {"forward": [], "backward": []}

    def recording(name, state_pass, state_in_position, segment_position):
        def record(*arguments):
            result = state_pass(*arguments)
            segment = arguments[segment_position] if len(arguments) > segment_position else None
            calls[name].append({"segment": segment, "state_in": arguments[state_in_position], "state_out": result[2]})
            return result

        return record

    for name, state_in_position, segment_position in (("forward", 4, 7), ("backward", 5, 9)):
        function_name = f"triton_state_pass_{name}"
        recorder = recording(name, getattr(chunk_triton, function_name), state_in_position, segment_position)
        monkeypatch.setattr(chunk_triton, function_name, recorder)
    on_device_upstream = {name: t.to(DEVICE) for name, t in upstream.items()}
    with launch_overrides(overlap_launch(0.01)):
        run_with_grads(
            chunk_gated_delta_rule, on_device(inputs, torch.float32), on_device_upstream, backend="triton",
            save_states=save_states,
        )
    first, second = Segment(0, 1), Segment(1, 4)
    forward = calls["forward"][:2]
    assert [call["segment"] for call in forward] == [first, second]
    assert forward[1]["state_in"] is forward[0]["state_out"]
    _, after_one_chunk = naive_recurrent_gated_delta_rule(
        *(inputs[name][:, :64] for name in ("q", "k", "v", "g", "beta")), initial_state=inputs["initial_state"],
        output_final_state=True,
    )
    assert relative_error(forward[0]["state_out"].cpu(), after_one_chunk) < 1e-5
    replays = calls["forward"][2:]
    assert [call["segment"] for call in replays] == ([] if save_states else [None])
    backward = calls["backward"]
    assert [call["segment"] for call in backward] == [second, first]
    assert backward[1]["state_in"] is backward[0]["state_out"]


def test_segments_split_the_kernel_chunks():
    from schedlang.kernels.gdn.overlap import Segment, split_into_segments

    assert split_into_segments(8, 1, 0.5) == (Segment(0, 8),)
    assert split_into_segments(8, 2, 0.25) == (Segment(0, 2), Segment(2, 8))
    assert split_into_segments(8, 2, 0.7) == (Segment(0, 6), Segment(6, 8))
    assert split_into_segments(8, 2, 0.01) == (Segment(0, 1), Segment(1, 8))
    assert split_into_segments(8, 2, 0.99) == (Segment(0, 7), Segment(7, 8))
    assert split_into_segments(1, 2, 0.5) == (Segment(0, 1),)
    with pytest.raises(ValueError, match="segments must be 1 or 2"):
        split_into_segments(8, 3, 0.5)
    with pytest.raises(ValueError, match="split must lie strictly between 0 and 1"):
        split_into_segments(8, 2, 1.0)
