"""Rotary position embeddings of ``attn`` layers ([Note: rotary positions] in schedlang.runtime.rotary).

* The rotation against a direct float64 implementation of the rotate-half formula (as complex products), its
  float32 tables against float64 trigonometry, and offsets: a table from ``start`` is the rows of one from 0.
* A model with rope, grouped key/value heads and q/k/v biases, in float64: the whole sequence in one call
  equals the sequence run chunk by chunk through the K/V buffers (several chunkings, two microbatches sharing
  the buffers' object, with and without the mixer recomputed), logits and every gradient within 1e-10;
  and rope changes the output (a rope that is silently not applied fails here).
* Generated scripts on CPU ranks in float64 (``tests/runtime/runtime_harness.py``): chunked with two
  microbatches, every recompute mode, two sequence-parallel gloo ranks and packed documents train as the
  one-chunk, one-microbatch run. The model's loss takes float32 logits (``StageModel.loss``), so losses and
  gradients agree within 1e-6 relative there; the 1e-10 checks of the same runs are the in-process ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from schedlang.runtime.kv_buffers import ChunkPosition, SequenceKV
from schedlang.runtime.model import build_stage_model
from schedlang.runtime.packing import DocumentLayout
from schedlang.runtime.rotary import apply_rotary, rotary_tables
from schedlang.vocabulary import AttentionOptions, ModelConfig, ModelOptions, Recompute

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from runtime_harness import assert_trains_like, run_jobs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime_sp"))

from sp_harness import chunk_slices, run_on_ranks  # noqa: E402


def _rotate_half_as_complex(tensor: torch.Tensor, cosine: torch.Tensor, sine: torch.Tensor) -> torch.Tensor:
    """Channel ``i`` and ``i + D/2`` as the complex number ``x_i + j x_{i + D/2}``, times ``cos + j sin``."""
    half = tensor.shape[-1] // 2
    pairs = torch.complex(tensor[..., :half], tensor[..., half:])
    turned = pairs * torch.complex(cosine, sine)[None, :, None, :]
    return torch.cat((turned.real, turned.imag), dim=-1)


@pytest.mark.parametrize("start", [0, 37])
def test_rotation_is_the_rotate_half_formula(start):
    x = torch.randn(2, 11, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cosine, sine = rotary_tables(8, 10000.0, start, start + 11, torch.float64, x.device)
    expected = _rotate_half_as_complex(x, cosine, sine)
    torch.testing.assert_close(apply_rotary(x, cosine, sine), expected, rtol=0, atol=1e-13)


def test_tables_are_float32_trigonometry_of_the_positions_cast_to_the_dtype():
    theta, head_dim, length = 500.0, 16, 200
    cosine, sine = rotary_tables(head_dim, theta, 0, length, torch.float64, torch.device("cpu"))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    angles = torch.arange(length, dtype=torch.float64)[:, None] * theta ** (-exponents)[None, :]
    # float32 angles, as flash-linear-attention computes them: within float32 rounding of angles up to 200
    torch.testing.assert_close(cosine, angles.cos(), rtol=0, atol=2e-5)
    torch.testing.assert_close(sine, angles.sin(), rtol=0, atol=2e-5)
    assert not torch.equal(cosine, angles.cos())  # float32 tables, not float64 ones
    later_cosine, later_sine = rotary_tables(head_dim, theta, 50, 80, torch.float64, torch.device("cpu"))
    assert torch.equal(later_cosine, cosine[50:80]) and torch.equal(later_sine, sine[50:80])
    bf16_cosine, _ = rotary_tables(head_dim, theta, 0, length, torch.bfloat16, torch.device("cpu"))
    assert torch.equal(bf16_cosine, cosine.float().to(torch.bfloat16))


def test_rotated_scores_depend_only_on_the_distance():
    generator = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, 1, 8, dtype=torch.float64, generator=generator) for _ in range(2))

    def score(query_position: int, key_position: int) -> float:
        rotated = []
        for tensor, position in ((q, query_position), (k, key_position)):
            cosine, sine = rotary_tables(8, 10000.0, position, position + 1, torch.float64, q.device)
            rotated.append(apply_rotary(tensor, cosine, sine))
        return float((rotated[0] * rotated[1]).sum())

    assert score(5, 2) == pytest.approx(score(45, 42), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)


LAYERS = ("gla", "attn", "attn")
ROPE = AttentionOptions(heads=4, head_dim=8, kv_heads=2, qkv_bias=True, rope_theta=50.0)


def _model(attention: AttentionOptions, recompute: Recompute = Recompute.NONE):
    config = ModelConfig(
        vocab=32,
        d_model=16,
        layers=LAYERS,
        heads=2,
        head_dim=8,
        mlp_ratio=2.0,
        options=ModelOptions(attention=attention),
    )
    model = build_stage_model(
        config, (0, 1, 2), True, True, 5, torch.device("cpu"), torch.float64, recompute=recompute
    )
    with torch.no_grad():  # biases away from their zero initialisation, so that they take part
        for name, parameter in model.named_parameters():
            if name.endswith("_proj.bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(len(name))))
    return model


TOKENS = torch.randint(0, 32, (2, 2, 30), generator=torch.Generator().manual_seed(2))  # [microbatch, B, L]


def _whole_sequence(model, layout: DocumentLayout | None = None):
    """Logits per microbatch and the summed gradients, each microbatch as one call (``layout``: the rows'
    packed documents)."""
    model.zero_grad()
    logits = []
    for tokens in TOKENS:
        documents = None if layout is None else layout.chunk(0, tokens.shape[0], 0, tokens.shape[1])
        hidden, _ = model(tokens, [None] * model.n_states, None, documents)
        logits.append(model.logits(hidden))
        (logits[-1] ** 2).sum().backward()
    return torch.stack(logits).detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def _chunk_by_chunk(model, bounds: tuple[int, ...], layout: DocumentLayout | None = None):
    """The same, each microbatch in chunks through one SequenceKV, backwards in reverse chunk order."""
    model.zero_grad()
    kv, outputs = SequenceKV(TOKENS.shape[-1]), {}
    for microbatch, tokens in enumerate(TOKENS):
        states = [None] * model.n_states
        for start, end in zip(bounds, bounds[1:]):
            position = ChunkPosition(kv, microbatch, start, end)
            documents = None if layout is None else layout.chunk(0, tokens.shape[0], start, end)
            hidden, states = model(tokens[:, start:end], states, position, documents)
            outputs[microbatch, start] = model.logits(hidden)
    for microbatch in reversed(range(len(TOKENS))):
        for start in reversed(bounds[:-1]):
            (outputs[microbatch, start] ** 2).sum().backward(retain_graph=True)
        kv.close(microbatch)
    logits = torch.stack(
        [torch.cat([outputs[microbatch, start] for start in bounds[:-1]], dim=1) for microbatch in range(len(TOKENS))]
    )
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("bounds", [(0, 30), (0, 15, 30), (0, 7, 19, 30), (0, 1, 29, 30)])
@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.MIXER])
def test_chunked_attention_with_rope_equals_the_whole_sequence(bounds, recompute):
    expected_logits, expected_grads = _whole_sequence(_model(ROPE))
    logits, grads = _chunk_by_chunk(_model(ROPE, recompute), bounds)
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-10)
    assert sorted(grads) == sorted(expected_grads)
    for name, gradient in grads.items():
        torch.testing.assert_close(gradient, expected_grads[name], rtol=0, atol=1e-10, msg=name)


LAYOUT = DocumentLayout(((11, 12), (4, 20, 26)))  # document starts per row: inside and across the chunks


@pytest.mark.parametrize("bounds", [(0, 15, 30), (0, 7, 19, 30), (0, 4, 12, 30)])
def test_packed_documents_with_rope_chunked_equal_the_whole_sequence(bounds):
    expected_logits, expected_grads = _whole_sequence(_model(ROPE), LAYOUT)
    logits, grads = _chunk_by_chunk(_model(ROPE), bounds, LAYOUT)
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-10)
    for name, gradient in grads.items():
        torch.testing.assert_close(gradient, expected_grads[name], rtol=0, atol=1e-10, msg=name)


def test_packed_documents_at_absolute_positions_equal_each_document_from_position_zero():
    """[Note: rotary positions]: only distances enter the scores, so a packed document's outputs are its
    own from position 0, up to the float32 rounding of the rotation angles at other positions."""
    model = _model(ROPE)
    tokens = TOKENS[0, :1]
    starts = (0, 9, 21, 30)
    with torch.no_grad():
        layout = DocumentLayout((starts[1:-1],))
        packed, _ = model(tokens, [None] * model.n_states, None, layout.chunk(0, 1, 0, 30))
        for first, end in zip(starts, starts[1:]):
            alone, _ = model(tokens[:, first:end], [None] * model.n_states)
            torch.testing.assert_close(packed[:, first:end], alone, rtol=0, atol=1e-6)
        # the same packing without the document mask is a different computation
        unmasked, _ = model(tokens, [None] * model.n_states)
        assert (unmasked[:, 9:] - packed[:, 9:]).abs().max() > 1e-3


def _sequence_parallel_worker(rank: int, world_size: int, bounds: tuple[int, ...]) -> None:
    """Each rank runs its slice of every chunk (contiguous split) of an attention-only model with rope;
    its logits and the gradients summed over the ranks are the one-device run's."""
    import torch.distributed as dist

    from schedlang.runtime.mixer_base import SequenceParallelContext

    config = ModelConfig(
        vocab=32, d_model=16, layers=("attn", "attn"), heads=2, head_dim=8, mlp_ratio=2.0,
        options=ModelOptions(attention=ROPE),
    )
    single = build_stage_model(config, (0, 1), True, True, 5, torch.device("cpu"), torch.float64)
    context = SequenceParallelContext(dist.group.WORLD, "allgather", 1)
    split = build_stage_model(config, (0, 1), True, True, 5, torch.device("cpu"), torch.float64, context)
    tokens = TOKENS[0]
    hidden, _ = single(tokens, [None, None])
    expected = single.logits(hidden)
    (expected**2).sum().backward()
    kv, outputs = SequenceKV(tokens.shape[1]), []
    for chunk_start, chunk_end in zip(bounds, bounds[1:]):
        slices = chunk_slices(chunk_start, chunk_end, world_size)
        start, end = slices[rank]
        hidden, _ = split(tokens[:, start:end], [None, None], ChunkPosition(kv, 0, start, end, slices))
        outputs.append(((start, end), split.logits(hidden)))
    for (start, end), logits in reversed(outputs):
        torch.testing.assert_close(logits, expected[:, start:end].detach(), rtol=0, atol=1e-10)
        (logits**2).sum().backward()
    for (name, parameter), (_, reference) in zip(split.named_parameters(), single.named_parameters()):
        gradient = parameter.grad.clone()
        dist.all_reduce(gradient)
        torch.testing.assert_close(gradient, reference.grad, rtol=0, atol=1e-10, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("world_size, bounds", [(2, (0, 13, 30)), (3, (0, 30))])
def test_sequence_parallel_attention_with_rope_equals_one_device(world_size, bounds):
    run_on_ranks(world_size, _sequence_parallel_worker, bounds)


def test_rope_changes_the_output_and_only_rope_does():
    with_rope, _ = _whole_sequence(_model(ROPE))
    without, _ = _whole_sequence(_model(AttentionOptions(heads=4, head_dim=8, kv_heads=2, qkv_bias=True)))
    assert (with_rope - without).abs().max() > 1e-3
    # the first token attends only to itself, where the rotation of q and k cancels
    torch.testing.assert_close(with_rope[:, :, 0], without[:, :, 0], rtol=0, atol=1e-12)


def test_grouped_heads_and_biases_have_their_shapes():
    mixer = _model(ROPE).layers["1"].mixer
    assert mixer.q_proj.weight.shape == (32, 16) and mixer.k_proj.weight.shape == (16, 16)
    assert mixer.v_proj.bias.shape == (16,) and mixer.o_proj.weight.shape == (16, 32)
    assert _model(ROPE).layers["0"].mixer.q_proj.bias is None  # the gla layer keeps its own layout


SCHEDULE = """schedule {name}
model {{
  vocab = 64  d_model = 16  heads = 2  head_dim = 8  layers = [gla, attn] * 2  mlp = swiglu(ratio = 2)
  attn_heads = 4  attn_kv_heads = 2  qkv_bias = true  rope_theta = 100
}}
mesh {{ sequence = {sequence} }}
sequence {{ length = 48  chunks = {chunks}  kernel_chunk = 4  parallel = allgather }}
pipeline {{ microbatches = {microbatches}  microbatch_size = {microbatch_size}  recompute = {recompute} }}
train {{ steps = 2  dtype = fp64  seed = 1  optimizer = adamw(lr = 1e-2)  data = {data} }}
"""
STEPS = 2
FLOAT32_LOSS_TOLERANCE = 1e-6  # the cross-entropy of float32 logits, whatever the model's dtype


def _schedule(name, chunks=1, microbatches=1, recompute="none", sequence=1, data="synthetic(seed = 2)"):
    return SCHEDULE.format(
        name=name,
        chunks=chunks,
        microbatches=microbatches,
        microbatch_size=4 // microbatches,
        recompute=recompute,
        sequence=sequence,
        data=data,
    )


@pytest.mark.slow
def test_generated_scripts_with_rope_train_exactly_as_one_chunk(tmp_path):
    tokens = torch.randint(0, 64, (4096,), generator=torch.Generator().manual_seed(3))
    tokens[::13] = 7  # document ends every 13 tokens, so documents cross the chunks' boundaries
    token_file = tmp_path / "tokens.bin"
    token_file.write_bytes(b"".join(int(token).to_bytes(2, "little") for token in tokens))
    packed = f'tokens(path = "{token_file}", document_end = 7)'
    jobs = {
        1: {
            "reference": _schedule("reference"),
            "chunked": _schedule("chunked", chunks=3, microbatches=2),
            "recompute_mlp": _schedule("recompute_mlp", chunks=2, microbatches=2, recompute="mlp"),
            "recompute_mixer": _schedule("recompute_mixer", chunks=2, microbatches=2, recompute="mixer"),
            "recompute_full": _schedule("recompute_full", chunks=3, microbatches=2, recompute="full"),
            "packed_reference": _schedule("packed_reference", data=packed),
            "packed_chunked": _schedule("packed_chunked", chunks=3, microbatches=2, data=packed),
        },
        2: {"sequence_parallel": _schedule("sequence_parallel", chunks=2, microbatches=2, sequence=2)},
    }
    outcomes = run_jobs(jobs, tmp_path, STEPS)
    for name in ("chunked", "recompute_mlp", "recompute_mixer", "recompute_full", "sequence_parallel"):
        assert_trains_like(outcomes[name], outcomes["reference"], STEPS, FLOAT32_LOSS_TOLERANCE)
    assert_trains_like(outcomes["packed_chunked"], outcomes["packed_reference"], STEPS, FLOAT32_LOSS_TOLERANCE)
    assert outcomes["reference"][0][0] != outcomes["reference"][0][1]  # the steps train
