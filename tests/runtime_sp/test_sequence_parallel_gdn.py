"""Sequence-parallel Gated DeltaNet: the (transition, state) pair scan on 2, 3 and 4 gloo ranks.

Three levels, each against one process:

* the pair scan alone (``StateScanFunction``): random ``(M(p), S_local(p))`` per rank, and random decays for
  the diagonal transition, against a sequential float64 fold of the pairs, with the gradients of every
  rank's pair, of the initial state and through the final state;
* the operator (``sequence_parallel_gated_delta_rule``): outputs, final state (bit-identical on every rank)
  and the gradients of q, k, v, g, beta and initial_state against the float64 token-by-token recurrence
  and, in float32, against single-device ``chunk_gated_delta_rule`` (one case on the Triton state pass, in
  Triton's interpreter); every method, uneven splits, with and without initial and final states; a negative
  control that drops the transition and must fail;
* a whole model with gdn layers trained with ``mesh.sequence`` 2, 3, 4 and pipeline 2 x sequence 2 against
  the single-process run (losses and every gradient within 1e-5).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from schedlang.compiler import Pass, ScheduleText, compile_schedule as compile_program
from schedlang.kernels.common.heads import repeat_each_head
from schedlang.kernels.gdn import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
from schedlang.lowering.cost import FlopsCostModel, Hardware, state_scan_seconds
from schedlang.runtime.scan_common import DiagonalDecay, MatrixTransition
from schedlang.runtime.sequence_parallel import (
    ScanConfig,
    SequenceParallelMethod,
    StateScanFunction,
    sequence_parallel_gated_delta_rule,
)
from sp_harness import run_on_ranks
from sp_reference import relative_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_harness import assert_trains_like, run_jobs  # noqa: E402  (the runtime tests' job runner)

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
BATCH, HEADS = 2, 2
WORLD_SIZES = [2, 3, 4]


def _uneven_lengths(total: int, parts: int, generator: torch.Generator) -> list[int]:
    cuts = sorted((torch.randperm(total - 1, generator=generator)[: parts - 1] + 1).tolist())
    bounds = [0, *cuts, total]
    return [bounds[i + 1] - bounds[i] for i in range(parts)]


def _leaf(tensor):
    return None if tensor is None else tensor.detach().clone().requires_grad_(True)


class Checker:
    """Collects every failing comparison of one rank, so one spawned world reports all of them."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.failures: list[str] = []

    def close(self, what: str, actual, wanted, tolerance: float) -> None:
        error = relative_error(actual, wanted)
        if not error <= tolerance:
            self.failures.append(f"{self.label} {what}: relative error {error:.2e}")

    def fail(self, message: str) -> None:
        self.failures.append(f"{self.label} {message}")

    def raise_if_failed(self) -> None:
        if self.failures:
            raise AssertionError("\n".join(self.failures))




@dataclass(frozen=True)
class ScanCase:
    method: SequenceParallelMethod
    transition: str  # "matrix" or "decay"
    scan_blocks: int = 1
    with_initial_state: bool = True
    output_final_state: bool = True
    seed: int = 0

    @property
    def name(self) -> str:
        return (
            f"scan-{self.method.value}-blocks{self.scan_blocks}-{self.transition}"
            f"-init{int(self.with_initial_state)}-final{int(self.output_final_state)}"
        )


SCAN_KEY_DIM, SCAN_VALUE_DIM = 4, 6


def _scan_cases() -> list[ScanCase]:
    cases, seed = [], 0
    for method in SequenceParallelMethod:
        blocks = 3 if method is SequenceParallelMethod.ALLSCAN else 1
        for transition in ("matrix", "decay"):
            for initial, final in ((True, True), (False, True), (True, False), (False, False)):
                cases.append(ScanCase(method, transition, blocks, initial, final, seed))
                seed += 1
    cases.append(ScanCase(SequenceParallelMethod.ALLSCAN, "matrix", SCAN_VALUE_DIM, seed=seed))
    return cases


def _scan_inputs(case: ScanCase, size: int) -> dict:
    generator = torch.Generator().manual_seed(500 + case.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    state_shape = (BATCH, HEADS, SCAN_KEY_DIM, SCAN_VALUE_DIM)
    if case.transition == "matrix":
        transitions = [randn(BATCH, HEADS, SCAN_KEY_DIM, SCAN_KEY_DIM) / SCAN_KEY_DIM**0.5 for _ in range(size)]
    else:
        transitions = [torch.rand(BATCH, HEADS, SCAN_KEY_DIM, 1, generator=generator, dtype=torch.float64)
                       for _ in range(size)]
    return {
        "locals": [randn(*state_shape) for _ in range(size)],
        "transitions": transitions,
        "initial_state": randn(*state_shape) if case.with_initial_state else None,
        "carry_weights": [randn(*state_shape) for _ in range(size)],
        "final_weights": [randn(*state_shape) for _ in range(size)],
    }


def _apply(case: ScanCase, transition, state):
    return transition @ state if case.transition == "matrix" else transition * state


def _grad_or_zeros(leaf: torch.Tensor) -> torch.Tensor:
    """The last rank's pair reaches the loss only through the final state: without one, its gradient is zero."""
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)


def _scan_reference(case: ScanCase, inputs: dict) -> dict:
    """The sequential fold ``carry <- T(p)(carry) + x(p)`` over all ranks in one process, with autograd."""
    size = len(inputs["locals"])
    locals_ = [_leaf(tensor) for tensor in inputs["locals"]]
    transitions = [_leaf(tensor) for tensor in inputs["transitions"]]
    initial_state = _leaf(inputs["initial_state"])
    carry = initial_state if initial_state is not None else torch.zeros_like(locals_[0])
    carries_in = []
    for rank in range(size):
        carries_in.append(carry)
        carry = _apply(case, transitions[rank], carry) + locals_[rank]
    loss = sum((carries_in[rank] * inputs["carry_weights"][rank]).sum() for rank in range(size))
    if case.output_final_state:
        loss = loss + (carry * sum(inputs["final_weights"])).sum()
    loss.backward()
    return {
        "carries_in": [tensor.detach() for tensor in carries_in],
        "final_state": carry.detach(),
        "local_grads": [_grad_or_zeros(leaf) for leaf in locals_],
        "transition_grads": [_grad_or_zeros(leaf) for leaf in transitions],
        "initial_grad": None if initial_state is None else initial_state.grad,
    }


def _check_scan_case(case: ScanCase, check: Checker) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs = _scan_inputs(case, size)
    expected = _scan_reference(case, inputs)
    local, transition = _leaf(inputs["locals"][rank]), _leaf(inputs["transitions"][rank])
    initial_state = _leaf(inputs["initial_state"])
    config = ScanConfig(
        group=None, method=case.method, scan_blocks=case.scan_blocks, output_final_state=case.output_final_state
    )
    kind = MatrixTransition if case.transition == "matrix" else DiagonalDecay
    state_in, final_state = StateScanFunction.apply(local, transition, initial_state, kind, config)
    loss = (state_in * inputs["carry_weights"][rank]).sum()
    if case.output_final_state:
        loss = loss + (final_state * inputs["final_weights"][rank]).sum()
    loss.backward()
    tolerance = TOLERANCE[torch.float64]
    check.close(f"{case.name} state_in", state_in, expected["carries_in"][rank], tolerance)
    check.close(f"{case.name} d local", local.grad, expected["local_grads"][rank], tolerance)
    check.close(f"{case.name} d transition", transition.grad, expected["transition_grads"][rank], tolerance)
    if case.output_final_state:
        check.close(f"{case.name} final_state", final_state, expected["final_state"], tolerance)
    elif final_state is not None:
        check.fail(f"{case.name}: final_state returned although not requested")
    if case.with_initial_state:
        if rank == 0:
            check.close(f"{case.name} d initial_state", initial_state.grad, expected["initial_grad"], tolerance)
        elif initial_state.grad.abs().max().item() != 0.0:
            check.fail(f"{case.name}: nonzero d initial_state off rank 0")


def check_scan_cases(rank: int, world_size: int, cases: list[ScanCase]) -> None:
    check = Checker(f"world{world_size} rank {rank}")
    for case in cases:
        _check_scan_case(case, check)
    check.raise_if_failed()


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES, ids=[f"ranks{size}" for size in WORLD_SIZES])
def test_the_pair_scan_matches_the_sequential_fold(world_size):
    run_on_ranks(world_size, check_scan_cases, _scan_cases())




@dataclass(frozen=True)
class OperatorCase:
    method: SequenceParallelMethod
    scan_blocks: int = 1
    with_initial_state: bool = True
    output_final_state: bool = True
    total_length: int = 41
    key_dim: int = 8
    value_dim: int = 6
    dtype: torch.dtype = torch.float64
    via_kernel: bool = False  # reference: single-device chunk_gated_delta_rule instead of the recurrence
    seed: int = 0
    backend: str = "torch"  # "triton": the state pass a GPU runs, in Triton's interpreter here
    heads: int = HEADS  # v's heads
    query_heads: int = HEADS  # fewer than heads: grouped value heads, q and k passed that narrow

    @property
    def name(self) -> str:
        return (
            f"gdn-{self.method.value}-blocks{self.scan_blocks}-init{int(self.with_initial_state)}"
            f"-final{int(self.output_final_state)}-T{self.total_length}-{str(self.dtype).removeprefix('torch.')}"
            f"-{'kernel' if self.via_kernel else 'naive'}-{self.backend}-qk{self.query_heads}of{self.heads}"
        )


def _operator_cases() -> list[OperatorCase]:
    cases, seed = [], 0
    for method in SequenceParallelMethod:
        blocks = 2 if method is SequenceParallelMethod.ALLSCAN else 1
        for initial, final in ((True, True), (False, True), (True, False), (False, False)):
            cases.append(OperatorCase(method, blocks, initial, final, seed=seed))
            seed += 1
        # several kernel chunks per rank, in float32 against the single-device operator
        cases.append(OperatorCase(method, blocks, total_length=301, dtype=torch.float32, via_kernel=True, seed=seed))
        seed += 1
    cases.append(OperatorCase(SequenceParallelMethod.ALLSCAN, 4, total_length=150, key_dim=16, value_dim=16,
                              dtype=torch.float32, via_kernel=True, seed=seed, backend="triton"))
    # grouped value heads: 2 q/k heads under 4 value heads (1 under 2 in the first), against the reference on
    # explicitly repeated q and k
    cases.append(OperatorCase(SequenceParallelMethod.ALLSCAN, 2, seed=seed + 1, query_heads=1))
    cases.append(OperatorCase(SequenceParallelMethod.RING, total_length=301, dtype=torch.float32, via_kernel=True,
                              seed=seed + 2, heads=4, query_heads=2))
    cases.append(OperatorCase(SequenceParallelMethod.ALLGATHER, total_length=150, key_dim=16, value_dim=16,
                              dtype=torch.float32, via_kernel=True, seed=seed + 3, backend="triton", heads=4,
                              query_heads=2))
    return cases


def _operator_inputs(case: OperatorCase, size: int) -> dict:
    generator = torch.Generator().manual_seed(900 + case.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    length, key_dim, value_dim = case.total_length, case.key_dim, case.value_dim
    lengths = _uneven_lengths(length, size, generator)
    strength_per_rank = [0.3, 1.8, 0.05, 1.0]  # decay strength changes from one rank's slice to the next
    strength = torch.cat([torch.full((n,), strength_per_rank[rank % 4], dtype=torch.float64)
                          for rank, n in enumerate(lengths)]).view(1, length, 1)
    inputs = {
        "q": randn(BATCH, length, case.query_heads, key_dim),
        "k": F.normalize(randn(BATCH, length, case.query_heads, key_dim), dim=-1),
        "v": randn(BATCH, length, case.heads, value_dim),
        "g": F.logsigmoid(randn(BATCH, length, case.heads) + 2.0) * strength,
        "beta": torch.sigmoid(randn(BATCH, length, case.heads)),
        "initial_state": randn(BATCH, case.heads, key_dim, value_dim) if case.with_initial_state else None,
    }
    inputs = {name: None if tensor is None else tensor.to(case.dtype) for name, tensor in inputs.items()}
    inputs["lengths"] = lengths
    inputs["output_weight"] = randn(BATCH, length, case.heads, value_dim).to(case.dtype)
    inputs["final_weights"] = [randn(BATCH, case.heads, key_dim, value_dim).to(case.dtype) for _ in range(size)]
    return inputs


NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _operator_reference(case: OperatorCase, inputs: dict) -> dict:
    leaves = {name: _leaf(inputs[name]) for name in NAMES}
    # grouped value heads: the reference reads q and k repeated explicitly; autograd sums their gradients back
    arguments = [repeat_each_head(leaves["q"], case.heads), repeat_each_head(leaves["k"], case.heads)]
    arguments += [leaves[name] for name in ("v", "g", "beta")]
    scale = case.key_dim**-0.5
    if case.via_kernel:
        o, final_state = chunk_gated_delta_rule(
            *arguments, scale=scale, initial_state=leaves["initial_state"], output_final_state=True, backend="torch"
        )
    else:
        o, final_state = naive_recurrent_gated_delta_rule(
            *arguments, scale=scale, initial_state=leaves["initial_state"], output_final_state=True
        )
    loss = (o * inputs["output_weight"]).sum()
    if case.output_final_state:
        loss = loss + (final_state * sum(inputs["final_weights"])).sum()
    loss.backward()
    grads = {name: leaf.grad for name, leaf in leaves.items() if leaf is not None}
    return {"o": o.detach(), "final_state": final_state.detach(), "grads": grads}


def _check_operator_case(case: OperatorCase, check: Checker) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs = _operator_inputs(case, size)
    expected = _operator_reference(case, inputs)
    start = sum(inputs["lengths"][:rank])
    stop = start + inputs["lengths"][rank]
    local = {name: _leaf(inputs[name][:, start:stop]) for name in ("q", "k", "v", "g", "beta")}
    initial_state = _leaf(inputs["initial_state"])  # every rank passes one; only rank 0's may count
    o, final_state = sequence_parallel_gated_delta_rule(
        local["q"], local["k"], local["v"], local["g"], local["beta"], group=None, method=case.method,
        scan_blocks=case.scan_blocks, initial_state=initial_state, output_final_state=case.output_final_state,
        scale=case.key_dim**-0.5, backend=case.backend,
    )
    loss = (o * inputs["output_weight"][:, start:stop]).sum()
    if case.output_final_state:
        loss = loss + (final_state * inputs["final_weights"][rank]).sum()
    loss.backward()
    tolerance = TOLERANCE[case.dtype]
    check.close(f"{case.name} o", o, expected["o"][:, start:stop], tolerance)
    for name in ("q", "k", "v", "g", "beta"):
        check.close(f"{case.name} d{name}", local[name].grad, expected["grads"][name][:, start:stop], tolerance)
    if case.with_initial_state:
        if rank == 0:
            check.close(f"{case.name} d initial_state", initial_state.grad, expected["grads"]["initial_state"],
                        tolerance)
        elif initial_state.grad.abs().max().item() != 0.0:
            check.fail(f"{case.name}: nonzero d initial_state off rank 0")
    if case.output_final_state:
        check.close(f"{case.name} final_state", final_state, expected["final_state"], tolerance)
        copies = [torch.empty_like(final_state) for _ in range(size)]
        dist.all_gather(copies, final_state.detach().contiguous())
        if not all(torch.equal(copy, copies[0]) for copy in copies):
            check.fail(f"{case.name}: final_state differs between ranks")
    elif final_state is not None:
        check.fail(f"{case.name}: final_state returned although not requested")


def check_operator_cases(rank: int, world_size: int, cases: list[OperatorCase]) -> None:
    check = Checker(f"world{world_size} rank {rank}")
    for case in cases:
        _check_operator_case(case, check)
    check.raise_if_failed()


def check_operator_fails_without_the_transition(rank: int, world_size: int, cases: list[OperatorCase]) -> None:
    """Negative control: with the transition dropped (``S_out = S_in + S_local``), every case must fail."""
    with mock.patch.object(MatrixTransition, "step", lambda self, carry, local: local + carry):
        for case in cases:
            check = Checker(f"world{world_size} rank {rank}")
            _check_operator_case(case, check)
            if not check.failures:
                raise AssertionError(f"{case.name} passed on rank {rank} although the transition was dropped")


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES, ids=[f"ranks{size}" for size in WORLD_SIZES])
def test_the_operator_matches_the_single_device_computation(world_size):
    run_on_ranks(world_size, check_operator_cases, _operator_cases())


@pytest.mark.slow
def test_the_checks_fail_when_the_transition_is_dropped():
    cases = [OperatorCase(method, 2 if method is SequenceParallelMethod.ALLSCAN else 1, seed=index)
             for index, method in enumerate(SequenceParallelMethod)]
    run_on_ranks(3, check_operator_fails_without_the_transition, cases)


def test_allscan_blocks_are_groups_of_value_columns():
    arguments = [torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1),
                 torch.zeros(1, 3, 1)]
    with pytest.raises(ValueError, match=r"allscan\(blocks = 5\) needs 1 <= blocks <= value head dim \(4\)"):
        sequence_parallel_gated_delta_rule(*arguments, group=None, method="allscan", scan_blocks=5)


@pytest.mark.parametrize("method", list(SequenceParallelMethod), ids=[method.value for method in SequenceParallelMethod])
def test_the_simulator_gathers_the_transition_with_the_state(method):
    """The all-gather moves each rank's transition besides its float32 state (gdn's a [K, K] matrix per head, gla's
    a decay per key row); the point-to-point methods pass carries only."""
    parallel = "allscan(blocks = 1)" if method is SequenceParallelMethod.ALLSCAN else method.value
    text = _schedule("scan_bytes", "[gdn, gla]", 1, 4, parallel, 1)
    program = compile_program(ScheduleText(text, "s.sched"), through=Pass.CHECK).program
    model = FlopsCostModel(program, Hardware())
    batch, heads, dim, float32 = 2, 2, 16, 4
    state = batch * heads * dim * dim * float32
    allgather = method is SequenceParallelMethod.ALLGATHER
    gdn_bytes = 2 * state if allgather else state
    gla_bytes = state + batch * heads * dim * float32 if allgather else state
    expected = sum(state_scan_seconds(method, 4, 1, size, Hardware()) for size in (gdn_bytes, gla_bytes))
    assert model._sequence_parallel_seconds(0, 192, 0) == pytest.approx(expected)


STEPS = 2
MODEL_TOLERANCE = 1e-5


def _schedule(name: str, layers: str, pipeline: int, sequence: int, parallel: str, chunks: int,
              microbatches: int = 2, microbatch_size: int = 2) -> str:
    return f"""schedule {name}
model {{
  vocab = 64  d_model = 32  heads = 2  head_dim = 16
  layers = {layers}
  mlp = swiglu(ratio = 2)
}}
mesh {{ pipeline = {pipeline}  sequence = {sequence}  data = 1 }}
sequence {{ length = 192  chunks = {chunks}  kernel_chunk = 16  parallel = {parallel} }}
pipeline {{ microbatches = {microbatches}  microbatch_size = {microbatch_size}  order = 1f1b  recompute = none }}
train {{ steps = {STEPS}  seed = 7  optimizer = adamw(lr = 1e-2)  data = synthetic(seed = 5) }}
"""


MODEL_LAYERS = "[gdn, simple_gla, gdn, gla]"
MODEL_JOBS = {
    1: {"reference": _schedule("reference", MODEL_LAYERS, 1, 1, "allscan", 1, 1, 4)},
    2: {"p1_s2_n2_allscan": _schedule("p1_s2_n2_allscan", MODEL_LAYERS, 1, 2, "allscan(blocks = 4)", 2)},
    3: {"p1_s3_n2_ring": _schedule("p1_s3_n2_ring", MODEL_LAYERS, 1, 3, "ring", 2)},
    4: {
        "p2_s2_n3_allgather": _schedule("p2_s2_n3_allgather", MODEL_LAYERS, 2, 2, "allgather", 3),
        "p1_s4_n3_allscan": _schedule("p1_s4_n3_allscan", MODEL_LAYERS, 1, 4, "allscan(blocks = 2)", 3),
    },
}


@pytest.fixture(scope="module")
def model_runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gdn_sequence_parallel")
    return run_jobs(MODEL_JOBS, directory, STEPS)


MODEL_NAMES = [name for size, jobs in MODEL_JOBS.items() if size > 1 for name in jobs]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_gdn_model_trains_sequence_parallel_exactly(model_runs, name):
    assert_trains_like(model_runs[name], model_runs["reference"], STEPS, MODEL_TOLERANCE)
    assert any("beta_proj" in key for key in model_runs[name][1])
