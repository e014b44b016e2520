"""Sequence-parallel GLA on 2 and 4 gloo ranks equals the single-device computation.

Every case checks, on every rank: the output slice, the final state (and that
it is bit-identical on all ranks), and the gradients of q, k, v, g and
initial_state, against a single-device run on the whole span. The reference is
a float64 token-by-token recurrence, or (``via_kernel``) ``chunk_gla`` /
``chunk_simple_gla`` on one device in the case's dtype, with spans long enough
that ranks hold several kernel chunks. The ranks run the PyTorch path of the
project's kernels, or (``backend="triton"``) the Triton kernels in Triton's
interpreter, which is the path a GPU run takes: its prepared updates, the
store-free scans that read each rank's boundary terms, and the finish from
the incoming state.
The loss gives each rank its own weights for the final state, so the
sum-over-ranks rule for its gradient is exercised too. Spawning is slow, so
each spawned world runs many cases and reports every failing one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from schedlang.kernels import chunk_gla, chunk_simple_gla
from schedlang.runtime.sequence_parallel import (
    GateKind,
    SequenceParallelMethod,
    sequence_parallel_chunk_gla,
)
from sp_harness import run_on_ranks
from sp_reference import naive_gla, relative_error

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
BATCH, HEADS, VALUE_DIM = 2, 2, 5


@dataclass(frozen=True)
class Case:
    method: SequenceParallelMethod
    gate: GateKind
    scan_blocks: int = 1
    key_dim: int = 8
    with_initial_state: bool = True
    output_final_state: bool = True
    seed: int = 0
    total_length: int = 29
    via_kernel: bool = False
    dtype: torch.dtype = torch.float64
    chained_spans: bool = False  # two spans, the first's final_state feeding the second
    backend: str = "torch"
    value_dim: int = VALUE_DIM

    @property
    def name(self) -> str:
        return (
            f"{self.method.value}-blocks{self.scan_blocks}-{self.gate.value}-K{self.key_dim}"
            f"-init{int(self.with_initial_state)}-final{int(self.output_final_state)}-T{self.total_length}"
            f"-{'kernel' if self.via_kernel else 'naive'}-{str(self.dtype).removeprefix('torch.')}"
            f"{'-chained' if self.chained_spans else ''}-{self.backend}-V{self.value_dim}"
        )


def _cases() -> list[Case]:
    cases = []
    seed = 0
    for gate in GateKind:
        for blocks in (1, 2, 4):
            cases.append(Case(SequenceParallelMethod.ALLSCAN, gate, blocks, seed=seed))
            seed += 1
        # K not a multiple of the block count: blocks of unequal row counts.
        cases.append(Case(SequenceParallelMethod.ALLSCAN, gate, 4, key_dim=6, seed=seed))
        cases.append(Case(SequenceParallelMethod.RING, gate, seed=seed + 1))
        cases.append(Case(SequenceParallelMethod.ALLGATHER, gate, seed=seed + 2))
        seed += 3
    for method in SequenceParallelMethod:
        cases.append(Case(method, GateKind.VECTOR, 2, with_initial_state=False, output_final_state=False, seed=seed))
        cases.append(Case(method, GateKind.SCALAR, 2, with_initial_state=False, output_final_state=True, seed=seed + 1))
        cases.append(Case(method, GateKind.VECTOR, 2, with_initial_state=True, output_final_state=False, seed=seed + 2))
        seed += 3
    for method in SequenceParallelMethod:
        for gate in GateKind:
            for dtype in (torch.float64, torch.float32):
                cases.append(Case(method, gate, 4, seed=seed, total_length=157, via_kernel=True, dtype=dtype))
                seed += 1
    for method in SequenceParallelMethod:
        cases.append(Case(method, GateKind.VECTOR, 2, seed=seed, total_length=45, via_kernel=True, chained_spans=True))
        cases.append(Case(method, GateKind.SCALAR, 2, seed=seed + 1, total_length=45, chained_spans=True))
        seed += 2
    return cases


def _interpreter_cases() -> list[Case]:
    """The Triton path (interpreted on CPU): every method, both gates, float32, several chunks per rank."""
    cases = []
    seed = 200
    for method in SequenceParallelMethod:
        for gate in GateKind:
            cases.append(
                Case(method, gate, 2, key_dim=16, value_dim=16, seed=seed, total_length=211, via_kernel=True,
                     dtype=torch.float32, backend="triton")
            )
            seed += 1
    cases.append(
        Case(SequenceParallelMethod.ALLSCAN, GateKind.VECTOR, 2, key_dim=16, value_dim=16, seed=seed, total_length=150,
             via_kernel=True, dtype=torch.float32, backend="triton", chained_spans=True)
    )
    return cases


CASES = _cases()


def _uneven_lengths(total: int, parts: int, generator: torch.Generator) -> list[int]:
    cuts = sorted((torch.randperm(total - 1, generator=generator)[: parts - 1] + 1).tolist())
    bounds = [0, *cuts, total]
    return [bounds[i + 1] - bounds[i] for i in range(parts)]


def _make_inputs(case: Case, group_size: int) -> dict:
    """Whole-span inputs, identical on every rank (same seed)."""
    generator = torch.Generator().manual_seed(1000 + case.seed)
    total_length = case.total_length
    lengths = _uneven_lengths(total_length, group_size, generator)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(case.dtype)

    gate_shape = (BATCH, total_length, HEADS, case.key_dim) if case.gate is GateKind.VECTOR else (BATCH, total_length, HEADS)
    # Decay strength changes from one rank's slice to the next: weak, strong, very weak, ...
    strength_per_rank = [0.3, 1.8, 0.05, 1.0]
    strength = torch.cat(
        [torch.full((length,), strength_per_rank[rank % 4], dtype=case.dtype) for rank, length in enumerate(lengths)]
    )
    strength = strength.view(1, total_length, *([1] * (len(gate_shape) - 2)))
    return {
        "lengths": lengths,
        "q": randn(BATCH, total_length, HEADS, case.key_dim),
        "k": randn(BATCH, total_length, HEADS, case.key_dim),
        "v": randn(BATCH, total_length, HEADS, case.value_dim),
        "g": F.logsigmoid(randn(*gate_shape) + 2.0) * strength,
        "initial_state": randn(BATCH, HEADS, case.key_dim, case.value_dim) if case.with_initial_state else None,
        "output_weight": randn(BATCH, total_length, HEADS, case.value_dim),
        "final_weights": [randn(BATCH, HEADS, case.key_dim, case.value_dim) for _ in range(group_size)],
    }


def _leaf(tensor):
    return None if tensor is None else tensor.detach().clone().requires_grad_(True)


def _reference(case: Case, inputs: dict) -> dict:
    names = ("q", "k", "v", "g", "initial_state")
    leaves = {name: _leaf(inputs[name]) for name in names}
    scale = case.key_dim**-0.5
    if case.via_kernel:
        kernel = chunk_gla if case.gate is GateKind.VECTOR else chunk_simple_gla
        o, final_state = kernel(
            leaves["q"], leaves["k"], leaves["v"], leaves["g"], scale=scale,
            initial_state=leaves["initial_state"], output_final_state=True, backend="torch",
        )
    else:
        o, final_state = naive_gla(
            leaves["q"], leaves["k"], leaves["v"], leaves["g"], scale, leaves["initial_state"]
        )
    loss = (o * inputs["output_weight"]).sum()
    if case.output_final_state:
        loss = loss + (final_state * sum(inputs["final_weights"])).sum()
    loss.backward()
    grads = {name: leaf.grad for name, leaf in leaves.items() if leaf is not None}
    return {"o": o.detach(), "final_state": final_state.detach(), "grads": grads}


def _run_sequence_parallel(case: Case, local: dict, initial_state, group):
    scale = case.key_dim**-0.5
    options = dict(
        group=group,
        method=case.method,
        scan_blocks=case.scan_blocks,
        scale=scale,
        gate=case.gate,
        initial_state=initial_state,
        output_final_state=case.output_final_state,
    )
    return sequence_parallel_chunk_gla(local["q"], local["k"], local["v"], local["g"], backend=case.backend, **options)


def _check_chained_spans(case: Case, group, failures: list[str], label: str) -> None:
    """Two spans chained as the pipeline executor does: span 2 starts from span 1's final state.

    Each rank feeds its own copy of span 1's final state to span 2 as a fresh
    leaf, and hands that leaf's gradient back to its copy of span 1's final
    state: only rank 0's is nonzero, and the sum over ranks is the right one.
    """
    group_rank = dist.get_rank(group)
    group_size = dist.get_world_size(group)
    inputs = _make_inputs(case, group_size)
    expected = _reference(case, inputs)
    generator = torch.Generator().manual_seed(2000 + case.seed)
    first_span_length = case.total_length // 2 + 3
    span_bounds = [(0, first_span_length), (first_span_length, case.total_length)]
    rank_slices = []
    for span_start, span_stop in span_bounds:
        lengths = _uneven_lengths(span_stop - span_start, group_size, generator)
        start = span_start + sum(lengths[:group_rank])
        rank_slices.append(slice(start, start + lengths[group_rank]))

    state = _leaf(inputs["initial_state"])
    first_initial_state = state
    spans = []
    for rank_slice in rank_slices:
        local = {name: _leaf(inputs[name][:, rank_slice]) for name in ("q", "k", "v", "g")}
        o, final_state = _run_sequence_parallel(case, local, state, group)
        spans.append((local, o, final_state, state))
        state = _leaf(final_state)

    _, last_o, last_final_state, last_initial_state = spans[1]
    loss = (last_o * inputs["output_weight"][:, rank_slices[1]]).sum()
    loss = loss + (last_final_state * inputs["final_weights"][group_rank]).sum()
    loss.backward()
    _, first_o, first_final_state, _ = spans[0]
    torch.autograd.backward(
        [first_o, first_final_state],
        [inputs["output_weight"][:, rank_slices[0]], last_initial_state.grad],
    )

    def expect_close(what, actual, wanted):
        error = relative_error(actual, wanted)
        if not error <= TOLERANCE[case.dtype]:
            failures.append(f"{label} {case.name} group rank {group_rank}: {what} relative error {error:.2e}")

    for span_index, (local, o, _, _) in enumerate(spans):
        rank_slice = rank_slices[span_index]
        expect_close(f"span {span_index} o", o, expected["o"][:, rank_slice])
        for name in ("q", "k", "v", "g"):
            expect_close(f"span {span_index} d{name}", local[name].grad, expected["grads"][name][:, rank_slice])
    expect_close("final_state", last_final_state, expected["final_state"])
    if group_rank == 0:
        expect_close("d initial_state", first_initial_state.grad, expected["grads"]["initial_state"])


def _check_case(case: Case, group, failures: list[str], label: str) -> None:
    if case.chained_spans:
        _check_chained_spans(case, group, failures, label)
        return
    group_rank = dist.get_rank(group)
    group_size = dist.get_world_size(group)
    inputs = _make_inputs(case, group_size)
    expected = _reference(case, inputs)

    start = sum(inputs["lengths"][:group_rank])
    stop = start + inputs["lengths"][group_rank]
    local = {name: _leaf(inputs[name][:, start:stop]) for name in ("q", "k", "v", "g")}
    # Every rank passes an initial state; only group rank 0's may count.
    initial_state = _leaf(inputs["initial_state"])
    o, final_state = _run_sequence_parallel(case, local, initial_state, group)
    loss = (o * inputs["output_weight"][:, start:stop]).sum()
    if case.output_final_state:
        loss = loss + (final_state * inputs["final_weights"][group_rank]).sum()
    loss.backward()

    def expect_close(what, actual, wanted):
        error = relative_error(actual, wanted)
        if not error <= TOLERANCE[case.dtype]:
            failures.append(f"{label} {case.name} group rank {group_rank}: {what} relative error {error:.2e}")

    expect_close("o", o, expected["o"][:, start:stop])
    for name in ("q", "k", "v", "g"):
        expect_close(f"d{name}", local[name].grad, expected["grads"][name][:, start:stop])
    if case.with_initial_state:
        if group_rank == 0:
            expect_close("d initial_state", initial_state.grad, expected["grads"]["initial_state"])
        elif initial_state.grad.abs().max().item() != 0.0:
            failures.append(f"{label} {case.name} group rank {group_rank}: nonzero d initial_state off rank 0")
    if case.output_final_state:
        expect_close("final_state", final_state, expected["final_state"])
        copies = [torch.empty_like(final_state) for _ in range(group_size)]
        dist.all_gather(copies, final_state.detach().contiguous(), group=group)
        if not all(torch.equal(copy, copies[0]) for copy in copies):
            failures.append(f"{label} {case.name}: final_state differs between ranks")
    else:
        if final_state is not None:
            failures.append(f"{label} {case.name}: final_state returned although not requested")


def check_cases(rank: int, world_size: int, cases: list[Case], layout) -> None:
    """Run every case on the group this rank belongs to; ``layout`` lists groups of global ranks."""
    group = None
    label = f"world{world_size}"
    if layout is not None:
        for ranks in layout:
            created = dist.new_group(ranks)
            if rank in ranks:
                group, label = created, f"world{world_size}-group{ranks}"
    failures: list[str] = []
    for case in cases:
        _check_case(case, group, failures, label)
    if failures:
        raise AssertionError("\n".join(failures))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4], ids=["ranks2", "ranks4"])
def test_every_method_matches_the_single_device_computation(world_size):
    run_on_ranks(world_size, check_cases, CASES, None)


@pytest.mark.slow
def test_subgroups_use_group_ranks_and_a_group_of_one_runs_alone():
    layout = [[0, 2], [1], [3]]
    cases = [
        Case(SequenceParallelMethod.ALLSCAN, GateKind.VECTOR, 2, seed=40, total_length=17),
        Case(SequenceParallelMethod.RING, GateKind.SCALAR, seed=41, total_length=17),
        Case(SequenceParallelMethod.ALLGATHER, GateKind.VECTOR, seed=42, total_length=17),
    ]
    run_on_ranks(4, check_cases, cases, layout)


def test_the_runtime_names_methods_with_the_vocabulary_enum():
    from schedlang import vocabulary

    assert SequenceParallelMethod is vocabulary.SequenceParallelMethod
    assert SequenceParallelMethod("ring") is SequenceParallelMethod.RING


@pytest.mark.slow
def test_the_triton_path_matches_the_single_device_computation():
    run_on_ranks(2, check_cases, _interpreter_cases(), None)


def _arguments(key_dim=8, gate_dims=4, scan_blocks=2):
    return dict(
        q=torch.zeros(1, 3, 1, key_dim),
        k=torch.zeros(1, 3, 1, key_dim),
        v=torch.zeros(1, 3, 1, 2),
        g=torch.zeros(1, 3, 1, key_dim) if gate_dims == 4 else torch.zeros(1, 3, 1),
        group=None,
        method="allscan",
        scan_blocks=scan_blocks,
    )


def test_gate_kind_must_match_the_shape_of_g():
    with pytest.raises(ValueError, match=r"gate='scalar' needs g with 3 dims"):
        sequence_parallel_chunk_gla(**_arguments(gate_dims=4), gate="scalar")
    with pytest.raises(ValueError, match=r"gate='vector' needs g with 4 dims"):
        sequence_parallel_chunk_gla(**_arguments(gate_dims=3), gate="vector")


def test_more_scan_blocks_than_state_rows_is_refused():
    with pytest.raises(ValueError, match=r"allscan\(blocks = 9\) needs 1 <= blocks <= key head dim \(8\)"):
        sequence_parallel_chunk_gla(**_arguments(scan_blocks=9), gate="vector")
