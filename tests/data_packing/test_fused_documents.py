"""[Note: packed documents]: the fused call (one operator call over padded rows) equals the piece-by-piece calls
and each document alone, in the output, the final state and every gradient.

"Each document alone" is the token-by-token float64 recurrence of each piece, from its row's initial state
when the piece continues the previous chunk's document and from zeros otherwise, cut where the chunk's
``segment_ids`` change rather than at the pieces the packing code iterates. Layouts cover documents that start at
the chunk's start, inside it, at a kernel-chunk boundary, pieces whose length is a multiple of the kernel chunk,
one-token documents, rows of different layouts, rows with no start, the sequence's first chunk, and fresh
random layouts. The Triton kernels run in the interpreter in float32 (on a GPU, natively).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import schedlang.kernels
from schedlang.kernels import CHUNK_SIZE, chunk_gated_delta_rule, chunk_gla, chunk_simple_gla
from schedlang.kernels.gdn import naive_recurrent_gated_delta_rule
from schedlang.kernels.gla.naive import naive_recurrent_gla
from schedlang.kernels.simple_gla.naive import naive_recurrent_simple_gla
from schedlang.runtime import mixer_gdn, mixer_gla
from schedlang.runtime.packing import (
    RESET_LOG_GATE,
    ChunkDocuments,
    PaddedRows,
    padded_index,
    recurrent_by_document,
    recurrent_piece_by_piece,
)
from schedlang.vocabulary import GdnOptions, LayerKind, ModelConfig, ModelOptions

ON_GPU = torch.cuda.is_available()
FLOAT32_TOLERANCE = {"cpu": 5e-5, "cuda": 5e-3}
"""float32 against the float64 reference, as tests/kernels holds one call to it: the CPU's float32 products, or
a GPU's tf32 ones."""
HEADS, DIM = 2, 16
LOG_GATE = 3


@dataclass(frozen=True)
class Recurrence:
    """One operator: its chunked function, its token-by-token reference, its gate's shape and whether it takes
    a write strength ``beta``."""

    chunked: Callable
    naive: Callable
    gate_per_key: bool
    write_strength: bool

    def operator(self, function: Callable, **options):
        """``function`` as packing's ``operator(initial_state, *per_token)``."""
        return lambda state, *per_token: function(*per_token, initial_state=state, output_final_state=True, **options)


RECURRENCES = {
    "gla": Recurrence(chunk_gla, naive_recurrent_gla, gate_per_key=True, write_strength=False),
    "simple_gla": Recurrence(chunk_simple_gla, naive_recurrent_simple_gla, gate_per_key=False, write_strength=False),
    "gdn": Recurrence(
        chunk_gated_delta_rule, naive_recurrent_gated_delta_rule, gate_per_key=False, write_strength=True
    ),
}

C = CHUNK_SIZE
START = 1000
LAYOUTS = {
    # continues with a one-token piece, a document starting at a kernel-chunk boundary, one exactly C long;
    # starts at the chunk start, a one-token document inside, a one-token last piece; continues, no start;
    # starts at the chunk start, no start inside
    "mixed": ChunkDocuments(
        START, START + 3 * C + 8, (START - 100, START, START - 7, START),
        ((START + 1, START + C, START + 2 * C), (START + 37, START + 38, START + 3 * C + 7), (), ()),
    ),
    # a reset only where a row's chunk starts a document: no padding, the initial state masked
    "chunk_start_only": ChunkDocuments(START, START + 2 * C - 5, (START - 3, START, START), ((), (), ())),
    # the sequence's first chunk: no initial state to continue; pieces C - 1 and 2 C - 1 long (with the reset,
    # exactly one and two kernel chunks)
    "sequence_start": ChunkDocuments(0, 3 * C + 1, (0, 0), ((C - 1, 3 * C - 2), (2,))),
}


def random_documents(seed: int, length: int = 3 * C + 20) -> ChunkDocuments:
    """A chunk of 1-3 rows with random starts: each row continues or not, with 0-5 starts inside."""
    draw = random.Random(seed)
    rows = draw.randint(1, 3)
    first_starts = tuple(START - draw.randint(0, 1) * draw.randint(1, 50) for _ in range(rows))
    inner = tuple(
        tuple(sorted(draw.sample(range(START + 1, START + length), min(draw.randint(0, 5), length - 1))))
        for _ in range(rows)
    )
    return ChunkDocuments(START, START + length, first_starts, inner)


for seed in range(3):
    LAYOUTS[f"random{seed}"] = random_documents(seed)


def make_inputs(recurrence: Recurrence, documents: ChunkDocuments, with_state: bool, dtype, device, seed: int = 0):
    """(per-token tensors, initial state or None), fresh random leaves: gates log-sigmoid, gdn's keys unit-norm
    and its beta in (0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    rows, length = documents.rows, documents.end - documents.start

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q, k, v = draw(rows, length, HEADS, DIM), draw(rows, length, HEADS, DIM), draw(rows, length, HEADS, DIM)
    gate = F.logsigmoid(draw(rows, length, HEADS, *((DIM,) if recurrence.gate_per_key else ()))) / 4
    per_token = [q, k, v, gate]
    if recurrence.write_strength:
        per_token[1] = F.normalize(k, dim=-1)
        per_token.append(torch.sigmoid(draw(rows, length, HEADS)))
    state = draw(rows, HEADS, DIM, DIM) if with_state else None
    leaves = [tensor.to(device, dtype).requires_grad_(True) for tensor in per_token]
    if state is not None:
        state = state.to(device, torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_(True)
    return leaves, state


def documents_alone(recurrence: Recurrence, documents: ChunkDocuments, initial_state, *per_token):
    """(output, final state): each document piece through the float64 token-by-token reference by itself."""
    ids = documents.segment_ids()
    outputs, final_states = [], []
    for row in range(documents.rows):
        cuts = [0] + [p for p in range(1, ids.shape[1]) if ids[row, p] != ids[row, p - 1]] + [ids.shape[1]]
        continues = documents.first_starts[row] < documents.start
        state = initial_state[row : row + 1].double() if initial_state is not None and continues else None
        pieces = []
        for first, end in zip(cuts, cuts[1:]):
            piece = (tensor[row : row + 1, first:end].double() for tensor in per_token)
            output, final_state = recurrence.naive(*piece, initial_state=state, output_final_state=True)
            pieces.append(output)
            state = None
        outputs.append(torch.cat(pieces, dim=1))
        final_states.append(final_state)
    return torch.cat(outputs), torch.cat(final_states)


def values_and_gradients(run, per_token, initial_state, seed: int = 1):
    """[output, final state, then the gradient of every per-token tensor and of the initial state] for random
    output and final-state gradients; a leaf the run does not reach gets a zero gradient."""
    output, final_state = run(initial_state, *per_token)
    generator = torch.Generator().manual_seed(seed)
    output_grad = torch.randn(output.shape, generator=generator, dtype=torch.float64).to(output)
    state_grad = torch.randn(final_state.shape, generator=generator, dtype=torch.float64).to(final_state)
    leaves = [*per_token, *([initial_state] if initial_state is not None else [])]
    gradients = torch.autograd.grad((output, final_state), leaves, (output_grad, state_grad), allow_unused=True)
    gradients = [torch.zeros_like(leaf) if grad is None else grad for leaf, grad in zip(leaves, gradients)]
    return [output.detach(), final_state.detach(), *gradients]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    difference = (actual.double() - expected.double()).norm()
    return float(difference / expected.double().norm()) if expected.norm() > 0 else float(difference)


NAMES = ["output", "final_state", "dq", "dk", "dv", "dg"]


def assert_same(actual, expected, tolerance: float, names) -> None:
    assert len(actual) == len(expected) == len(names)
    for name, value, reference in zip(names, actual, expected):
        assert value.shape == reference.shape, name
        assert bool(torch.isfinite(value).all()), f"{name}: nan or inf"
        error = relative_error(value, reference)
        assert error <= tolerance, f"{name}: relative error {error:.2e}"


def gradient_names(recurrence: Recurrence, with_state: bool) -> list[str]:
    return NAMES + (["dbeta"] if recurrence.write_strength else []) + (["dinitial_state"] if with_state else [])


STATE_CASES = [
    pytest.param(layout, with_state, id=f"{layout}-{'initial_state' if with_state else 'no_initial_state'}")
    for layout in sorted(LAYOUTS)
    for with_state in (True, False)
    if with_state is False or LAYOUTS[layout].start > 0  # the sequence's first chunk has no state to continue
]


@pytest.mark.parametrize("layout, with_state", STATE_CASES)
@pytest.mark.parametrize("name", sorted(RECURRENCES))
def test_fused_equals_pieces_and_documents_alone_float64(name, layout, with_state):
    recurrence, documents = RECURRENCES[name], LAYOUTS[layout]
    per_token, state = make_inputs(recurrence, documents, with_state, torch.float64, "cpu")
    operator = recurrence.operator(recurrence.chunked, backend="torch")
    fused = values_and_gradients(
        lambda s, *x: recurrent_by_document(documents, s, operator, *x, log_gate=LOG_GATE), per_token, state
    )
    pieces = values_and_gradients(lambda s, *x: recurrent_piece_by_piece(documents, s, operator, *x), per_token, state)
    alone = values_and_gradients(lambda s, *x: documents_alone(recurrence, documents, s, *x), per_token, state)
    names = gradient_names(recurrence, with_state)
    assert_same(fused, pieces, 1e-12, names)
    assert_same(fused, alone, 1e-10, names)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(RECURRENCES))
def test_fused_equals_documents_alone_in_float32(name, backend):
    """float32, the PyTorch kernels and the Triton ones (the interpreter on a CPU): the fused call is as close to
    the float64 documents alone as the kernels' own tests require of one call, and as close as the
    piece-by-piece calls are (within twice their error, or 1e-6 on a CPU). On a CPU a reset in the middle of a
    kernel chunk fails the second bound (relative errors near 1e-4: [Note: packed documents])."""
    recurrence, documents = RECURRENCES[name], LAYOUTS["mixed"]
    device = "cuda" if ON_GPU and backend == "triton" else "cpu"
    per_token, state = make_inputs(recurrence, documents, True, torch.float32, device)
    operator = recurrence.operator(recurrence.chunked, backend=backend)
    fused = values_and_gradients(
        lambda s, *x: recurrent_by_document(documents, s, operator, *x, log_gate=LOG_GATE), per_token, state
    )
    pieces = values_and_gradients(lambda s, *x: recurrent_piece_by_piece(documents, s, operator, *x), per_token, state)
    alone = values_and_gradients(lambda s, *x: documents_alone(recurrence, documents, s, *x), per_token, state)
    names = gradient_names(recurrence, True)
    tolerance = FLOAT32_TOLERANCE[device]
    assert_same(fused, alone, tolerance, names)
    for quantity, value, piece_value, reference in zip(names, fused, pieces, alone):
        error, piece_error = relative_error(value, reference), relative_error(piece_value, reference)
        floor = 1e-6 if device == "cpu" else tolerance
        assert error <= max(2 * piece_error, floor), f"{quantity}: fused {error:.2e}, pieces {piece_error:.2e}"


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(RECURRENCES))
def test_pads_give_no_gate_gradient_and_every_gradient_is_finite(name, backend):
    """The kernel over the padded rows themselves: the gate gradient at every pad and reset token of a reset
    chunk (the reverse cumulative sum of their cumulative-gate gradients, which reaches the real tokens before
    them) is zero (float64 PyTorch: exactly; float32 Triton: within rounding of the largest gate gradient, as the
    gdn kernels form the reverse sums by differences), and no gradient anywhere, pads included, is nan or inf."""
    recurrence, documents = RECURRENCES[name], LAYOUTS["mixed"]
    device = "cuda" if ON_GPU and backend == "triton" else "cpu"
    dtype = torch.float64 if backend == "torch" else torch.float32
    per_token, state = make_inputs(recurrence, documents, True, dtype, device)
    index = padded_index(documents, CHUNK_SIZE, torch.device(device))
    padded = [
        index.lay_out(tensor.detach(), position == LOG_GATE).requires_grad_(True)
        for position, tensor in enumerate(per_token)
    ]
    operator = recurrence.operator(recurrence.chunked, backend=backend)
    gradients = values_and_gradients(operator, padded, state)[2:]
    for gradient in gradients:
        assert bool(torch.isfinite(gradient).all())
    gate_grad = gradients[LOG_GATE]
    bound = 0.0 if dtype == torch.float64 else FLOAT32_TOLERANCE[device] / 5 * float(gate_grad.abs().max())
    rows = index.rows
    pads_before_resets = 0
    for row in range(documents.rows):
        for (first, end), padded_start, reset in zip(documents.pieces(row), rows.piece_starts[row], rows.resets[row]):
            pads = slice(padded_start + end - first, reset + 1)
            largest = float(gate_grad[row, pads].abs().max())
            assert largest <= bound, f"row {row}: gate gradient {largest:.2e} at pads {pads}"
            pads_before_resets += reset - pads.start
    assert pads_before_resets > 0


def record_calls(documents: ChunkDocuments, per_token, initial_state):
    """The per-token tensors of each operator call ``recurrent_by_document`` makes, and its result."""
    calls = []

    def operator(state, *tensors):
        calls.append(tensors)
        return chunk_gla(*tensors, initial_state=state, output_final_state=True, backend="torch")

    return calls, recurrent_by_document(documents, initial_state, operator, *per_token, log_gate=LOG_GATE)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4 * C))
def test_each_reset_token_is_the_last_token_of_a_kernel_chunk(seed, length):
    """One operator call per chunk, and in it a reset gate exactly at the last token of the kernel chunks that
    end a piece, the next piece starting a kernel chunk, with fewer than ``CHUNK_SIZE`` pads per piece: a reset
    in the middle of a kernel chunk fails here."""
    documents = random_documents(seed, length)
    rows = PaddedRows.of(documents, CHUNK_SIZE)
    for row in range(documents.rows):
        pieces = documents.pieces(row)
        starts, resets = rows.piece_starts[row], rows.resets[row]
        assert len(starts) == len(pieces) and len(resets) == len(pieces) - 1 and starts[0] == 0
        for (first, end), start, reset, next_start in zip(pieces, starts, resets, starts[1:]):
            assert (reset + 1) % CHUNK_SIZE == 0 and next_start == reset + 1
            assert 0 <= reset - (start + end - first) < CHUNK_SIZE
        assert starts[-1] + pieces[-1][1] - pieces[-1][0] <= rows.length
    tensors, _ = make_inputs(RECURRENCES["gla"], documents, False, torch.float64, "cpu")
    calls, (output, _) = record_calls(documents, [tensor.detach() for tensor in tensors], None)
    assert len(calls) == 1 and output.shape == tensors[2].shape
    gate = calls[0][LOG_GATE]
    reset_positions = sorted({(row, p) for row, p in torch.nonzero(gate[..., 0, 0] == RESET_LOG_GATE).tolist()})
    if any(documents.inner_starts):
        assert gate.shape[1] == rows.length
        assert reset_positions == sorted((row, p) for row in range(documents.rows) for p in rows.resets[row])
    else:
        assert reset_positions == [] and gate.shape[1] == length
    for _, position in reset_positions:
        assert (position + 1) % CHUNK_SIZE == 0


@pytest.mark.parametrize("kind", ["gla", "simple_gla", "gdn", "gdn-grouped"])
def test_the_mixers_make_one_operator_call_per_chunk(kind, monkeypatch):
    """A gla, simple_gla or gdn mixer (also with grouped value heads, whose q and k reach the operator narrower
    than v) over a chunk with document starts inside calls its operator once, with the padded rows, and its
    output equals the piece-by-piece mixer's."""
    grouped = kind == "gdn-grouped"
    layer = LayerKind("gdn" if grouped else kind)
    options = ModelOptions(gdn=GdnOptions(value_heads=4)) if grouped else ModelOptions()
    config = ModelConfig(vocab=32, d_model=32, layers=(layer,), heads=2, head_dim=16, options=options)
    mixer = mixer_gdn.GatedDeltaMixer(config) if layer is LayerKind.GDN else mixer_gla.GatedLinearMixer(config, layer)
    mixer = mixer.double()
    mixer.reset_parameters(torch.Generator().manual_seed(0), 0.02)
    documents = LAYOUTS["mixed"]
    hidden = torch.randn(documents.rows, documents.end - documents.start, 32, dtype=torch.float64)
    state = torch.randn(documents.rows, 4 if grouped else 2, 16, 16, dtype=torch.float64)
    name = {"gla": "chunk_gla", "simple_gla": "chunk_simple_gla", "gdn": "chunk_gated_delta_rule"}[layer.value]
    operator, lengths, query_heads = getattr(schedlang.kernels, name), [], set()

    def counted(q, *rest, **options):
        lengths.append(q.shape[1])
        query_heads.add(q.shape[2])
        return operator(q, *rest, **options)

    monkeypatch.setattr(schedlang.kernels, name, counted)
    with torch.no_grad():
        fused, fused_state = mixer(hidden, state, documents)
    assert lengths == [PaddedRows.of(documents, CHUNK_SIZE).length]
    assert query_heads == {2}  # the model's heads: grouped q and k are not repeated to the 4 value heads
    module = mixer_gdn if layer is LayerKind.GDN else mixer_gla
    monkeypatch.setattr(
        module, "recurrent_by_document", lambda *arguments, log_gate: recurrent_piece_by_piece(*arguments)
    )
    with torch.no_grad():
        pieces, pieces_state = mixer(hidden, state, documents)
    assert len(lengths) == 1 + sum(len(documents.pieces(row)) for row in range(documents.rows))
    assert relative_error(fused, pieces) <= 1e-12 and relative_error(fused_state, pieces_state) <= 1e-12
