"""[Note: packed documents]: packed training equals training on each document alone.

A window holds three documents of unequal lengths per row, one crossing a chunk boundary and one starting
exactly at a chunk start (and, in the second row, a one-token document at the sequence's start and one
ending at the last input). The stage executor runs it in chunks, two microbatches, with gla, gdn, attn and
simple_gla layers in float64; the loss and every parameter gradient equal the sum of the per-document runs,
each document alone through its own whole-sequence forward, within 1e-10. Moving one boundary by one token
breaks the equality, so the test sees a boundary off by one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from schedlang.runtime import packing
from schedlang.runtime.executor import StageExecutor, StepShape
from schedlang.runtime.model import StageModel, build_stage_model
from schedlang.runtime.p2p import BufferPool
from schedlang.runtime.packing import DocumentLayout, loss_targets, loss_token_count
from schedlang.vocabulary import Action, ActionKind, LayerKind, ModelConfig, Recompute

VOCAB, END, LENGTH = 64, 63, 48
CHUNKS = (0, 16, 32, 48)
LAYERS = (LayerKind.GLA, LayerKind.ATTN, LayerKind.GDN, LayerKind.SIMPLE_GLA, LayerKind.ATTN)
# per row, the positions of document_end among the inputs 0 .. LENGTH - 1
ROW_ENDS = (
    (12, 31),  # documents 0..12, 13..31 (crosses the chunk boundary at 16), 32..48 (starts at chunk 2's start)
    (0, 15, 40),  # a one-token document, one ending at chunk 0's last token, then 16..40 and 41..48
    (5, 47),  # document_end as the last input: its target (the next document's first token) carries no loss
    (),  # one document: no reset anywhere
)


def packed_tokens(row_ends=ROW_ENDS) -> torch.Tensor:
    """``[rows, LENGTH + 1]`` token ids below END, with END at each row's document ends."""
    tokens = torch.randint(0, END, (len(row_ends), LENGTH + 1), generator=torch.Generator().manual_seed(3))
    for row, ends in enumerate(row_ends):
        tokens[row, list(ends)] = END
    return tokens


@pytest.fixture(autouse=True)
def float64_loss(monkeypatch):
    """The model's loss upcasts 16-bit logits to float32; here it keeps float64, so 1e-10 is a fair bound."""

    def loss(self, hidden, targets):
        logits = self.logits(hidden)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")

    monkeypatch.setattr(StageModel, "loss", loss)


def stage_model(layers=LAYERS, device="cpu", dtype=torch.float64):
    config = ModelConfig(vocab=VOCAB, d_model=32, layers=layers, heads=2, head_dim=16)
    return build_stage_model(config, tuple(range(len(layers))), True, True, 11, torch.device(device), dtype)


class LocalMessenger:
    """A one-stage executor sends nothing: only the receive-buffer pool and ``finish_sends`` are used."""

    def __init__(self) -> None:
        self.pool = BufferPool()

    def finish_sends(self) -> None:
        pass


def one_stage_actions(microbatches: int, n_chunks: int) -> tuple[Action, ...]:
    actions = []
    for microbatch in range(microbatches):
        actions += [Action(ActionKind.FORWARD, microbatch, chunk) for chunk in range(n_chunks)]
        actions += [Action(ActionKind.BACKWARD, microbatch, chunk) for chunk in reversed(range(n_chunks))]
    return tuple(actions)


def packed_run(
    tokens: torch.Tensor, chunks=CHUNKS, microbatches: int = 2, recompute=Recompute.NONE, layers=LAYERS, **placement
):
    """(loss, {name: gradient}) of one executor step over ``tokens`` with document_end = END; ``placement``:
    the model's ``device`` and ``dtype`` (the CPU and float64 by default)."""
    model = stage_model(layers, **placement)
    shape = StepShape(
        chunk_boundaries=chunks,
        local_chunk_bounds=tuple(zip(chunks, chunks[1:])),
        microbatch_size=tokens.shape[0] // microbatches,
        d_model=32,
        global_tokens=tokens.shape[0] * LENGTH,
        recompute=recompute,
        document_end=END,
    )
    actions = one_stage_actions(microbatches, len(chunks) - 1)
    activation_dtype = next(model.parameters()).dtype
    executor = StageExecutor(model, shape, actions, LocalMessenger(), 0, None, None, activation_dtype)
    loss = executor.run_step(tokens, loss_token_count(tokens, END))
    return float(loss), {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


def documents_of(row: torch.Tensor) -> list[tuple[int, int]]:
    """``(first, end)`` of each document among the inputs: its tokens up to and including document_end."""
    bounds = [0] + [position + 1 for position in range(LENGTH - 1) if row[position] == END] + [LENGTH]
    return list(zip(bounds, bounds[1:]))


def separate_run(tokens: torch.Tensor, layers=LAYERS, **placement):
    """(loss, {name: gradient}): each document alone, its own whole-sequence forward from no state, its inputs
    the document's tokens but its document_end, its targets the next ones; summed, over the same count."""
    model = stage_model(layers, **placement)
    count = loss_token_count(tokens, END)
    device = next(model.parameters()).device
    total = torch.zeros((), dtype=torch.float64, device=device)
    for row in tokens.to(device):
        for first, end in documents_of(row):
            last = end - 1 if row[end - 1] == END else end  # a document_end predicts nothing
            if last == first:
                continue  # a document that is only its document_end has no target
            hidden, _ = model(row[None, first:last], [None] * model.n_states)
            total = total + model.loss(hidden, row[None, first + 1 : last + 1]) / count
    total.backward()
    return total.item(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


def assert_same(packed, separate, tolerance: float = 1e-10) -> None:
    """The same loss, and every gradient within ``tolerance`` relative (in norm) of the reference's."""
    (loss, gradients), (reference_loss, reference_gradients) = packed, separate
    assert loss == pytest.approx(reference_loss, rel=tolerance, abs=0)
    assert sorted(gradients) == sorted(reference_gradients)
    for name, gradient in gradients.items():
        reference = reference_gradients[name]
        error = float((gradient - reference).norm() / reference.norm().clamp_min(1e-30))
        assert error <= tolerance, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.MIXER, Recompute.FULL])
def test_packed_chunks_equal_the_documents_alone(recompute):
    assert_same(packed_run(packed_tokens(), recompute=recompute), separate_run(packed_tokens()))


def test_one_chunk_and_uneven_chunks_equal_the_documents_alone():
    """One chunk per sequence, and chunks whose boundaries fall inside documents and next to document ends.

    Gated DeltaNet's write strength is a float32 sigmoid in the model, so cutting the sequence differently can
    flip a float32 rounding of its gradient (as it does without packing): gdn is held to 1e-6 under such cuts,
    the other layers to 1e-10."""
    uneven = (0, 1, 13, 14, 41, 48)
    assert_same(packed_run(packed_tokens(), chunks=(0, 48)), separate_run(packed_tokens()))
    exact_layers = tuple(kind for kind in LAYERS if kind is not LayerKind.GDN)
    separate = separate_run(packed_tokens(), exact_layers)
    assert_same(packed_run(packed_tokens(), chunks=uneven, microbatches=4, layers=exact_layers), separate)
    gdn = (LayerKind.GDN, LayerKind.ATTN)
    separate = separate_run(packed_tokens(), gdn)
    assert_same(packed_run(packed_tokens(), chunks=uneven, microbatches=4, layers=gdn), separate, tolerance=1e-6)


def test_whole_sequence_forward_with_documents_equals_the_chunked_one():
    """The unchunked path (attention under a block-causal mask) gives the executor's loss."""
    tokens = packed_tokens()
    model = stage_model()
    documents = DocumentLayout.of(tokens, END).chunk(0, tokens.shape[0], 0, LENGTH)
    hidden, _ = model(tokens[:, :LENGTH], [None] * model.n_states, None, documents)
    targets = loss_targets(tokens[:, :LENGTH], tokens[:, 1:], END)
    loss = float(model.loss(hidden, targets).detach() / loss_token_count(tokens, END))
    assert loss == pytest.approx(packed_run(tokens)[0], rel=1e-10, abs=0)


def test_a_boundary_off_by_one_is_caught(monkeypatch):
    """Documents starting one token late (the document_end's successor counted in the old document) no longer
    equal the documents alone: the comparison above can fail."""
    separate = separate_run(packed_tokens())
    exact = DocumentLayout.of

    def one_late(tokens, document_end):
        layout = exact(tokens, document_end)
        return DocumentLayout(tuple(tuple(min(p + 1, LENGTH - 1) for p in starts) for starts in layout.starts))

    monkeypatch.setattr(packing.DocumentLayout, "of", staticmethod(one_late))
    loss, gradients = packed_run(packed_tokens())
    assert abs(loss - separate[0]) > 1e-6 * abs(separate[0])


def test_without_document_end_documents_see_each_other():
    """The same window without packing is the plain causal model: it differs from the documents alone."""
    tokens = packed_tokens()
    model = stage_model()
    hidden, _ = model(tokens[:, :LENGTH], [None] * model.n_states)
    plain = F.cross_entropy(model.logits(hidden).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).item()
    assert abs(plain - separate_run(tokens)[0]) > 1e-3


def test_layout_and_targets_at_the_boundaries():
    tokens = packed_tokens()
    layout = DocumentLayout.of(tokens, END)
    assert layout.starts == ((13, 32), (1, 16, 41), (6,), ())  # row 2's document_end at 47 starts nothing inside
    chunk = layout.chunk(0, 2, 16, 32)
    assert chunk.first_starts == (13, 16) and chunk.inner_starts == ((), ())
    assert chunk.pieces(1) == ((16, 32),) and chunk.continues(0) and not chunk.continues(1)
    assert layout.chunk(0, 1, 32, 48).first_starts == (32,)
    targets = loss_targets(tokens[:, :LENGTH], tokens[:, 1:], END)
    ignored = {(int(row), int(column)) for row, column in torch.nonzero(targets == packing.IGNORED_TARGET)}
    assert ignored == {(row, end) for row, ends in enumerate(ROW_ENDS) for end in ends}
    assert loss_token_count(tokens, END) == 4 * LENGTH - 7
    assert loss_token_count(tokens, None) == 4 * LENGTH


def relative_errors(run, reference) -> tuple[float, dict[str, float]]:
    """The loss's and each gradient's relative error (in norm) against ``reference``, computed in float64 on the CPU."""
    (loss, gradients), (reference_loss, reference_gradients) = run, reference
    errors = {}
    for name, expected in reference_gradients.items():
        actual = gradients[name].detach().cpu().double()
        errors[name] = float((actual - expected.cpu()).norm() / expected.cpu().norm().clamp_min(1e-30))
    return abs(loss - reference_loss) / abs(reference_loss), errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_packed_chunks_equal_the_documents_alone_on_the_gpu():
    """The Triton kernels split at document starts and the CUDA attention kernels per document piece, in
    float32, against the documents alone in float64 on the CPU: packing adds no error beyond what float32 makes
    of the documents alone on the same GPU (each gradient within 4x that run's error, or 1e-5). A gradient that
    is a long sum, such as a norm weight's, differs between the two float32 runs by their summation orders
    alone, so a fixed float32 bound between them would test rounding, not packing."""
    reference = separate_run(packed_tokens())
    packed_loss_error, packed_errors = relative_errors(
        packed_run(packed_tokens(), device="cuda", dtype=torch.float32), reference
    )
    separate_loss_error, separate_errors = relative_errors(
        separate_run(packed_tokens(), device="cuda", dtype=torch.float32), reference
    )
    assert packed_loss_error <= max(4 * separate_loss_error, 1e-5)
    for name, error in packed_errors.items():
        assert error <= max(4 * separate_errors[name], 1e-5), (
            f"{name}: packed {error:.2e}, documents alone {separate_errors[name]:.2e} against float64"
        )
