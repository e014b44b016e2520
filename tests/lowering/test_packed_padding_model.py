"""The memory and cost models with packed documents: the recurrent operators' saved tensors, backward workspace
and FLOPs grow by exactly the padded tokens ([Note: packed documents] in schedlang.runtime.packing), measured from
the data by schedlang.preflight.with_document_pieces; ``simulate`` says so and ``simulate --fit`` fits with them."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from schedlang.commands.simulate_fit import evaluate
from schedlang.compiler import CostSettings, revise
from schedlang.frontend import load_program_text
from schedlang.lowering.cost import CostModelKind, FlopsCostModel
from schedlang.lowering.memory_peak import predict_memory
from schedlang.lowering.memory_terms import chunk_activation_bytes, transient_bytes
from schedlang.lowering.orders import stage_orders
from schedlang.preflight import with_document_pieces

END = 9
LENGTH, CHUNKS = 1024, 4  # chunks of L = 256 tokens
# d = 64, H = 2, D = 32, W = 64; bf16: e = 2, f = 4; two gla layers a stage; kernel chunks of C = 64
GLA_OPERATOR_BYTES = 3 * 64 * 2 + 64 * 4  # q, k, v and the log-gate, per token the operator runs over
GLA_RECOMPUTED_STATE_BYTES = 2 * 32 * 32 * 4 / 64  # H D x D fp32 states entering each kernel chunk, per token
GLA_RECURRENCE_FLOPS = 2 * (4 * 64 * 32 + 4 * 32 * 32)  # H (4 C D + 4 D^2) per token


def schedule(path: str, document_end: str = f", document_end = {END}", recompute: str = "none") -> str:
    return f"""\
schedule packed
model {{
  vocab    = 64
  d_model  = 64
  layers   = [gla] * 4
  heads    = 2
  head_dim = 32
  mlp      = swiglu(ratio = 4)
}}
mesh {{ pipeline = 2 }}
sequence {{
  length       = {LENGTH}
  chunks       = {CHUNKS}
  kernel_chunk = 64
}}
pipeline {{
  microbatches = 4
  microbatch_size = 2
  order        = 1f1b
  recompute    = {recompute}
}}
train {{
  steps = 1
  dtype = bf16
  data  = tokens(path = "{path}"{document_end})
}}
"""


@pytest.fixture
def ends_every_300(tmp_path):
    """A file whose ``document_end`` ids are 300 apart: a chunk of 256 tokens holds at most one document start, so
    two pieces, and its padded rows are at most 256 + 64 long (a leading piece of 64 tokens and its reset token
    take 128)."""
    ids = np.ones(6000, dtype="<u2")
    ids[150::300] = END
    path = tmp_path / "ids.bin"
    ids.tofile(path)
    return path


PADDED_TOKENS = 64  # per sequence and chunk, for the file above


def programs(path, recompute="none"):
    packed = with_document_pieces(load_program_text(schedule(str(path), recompute=recompute)))
    return packed, replace(packed, document_pieces=None)


def test_the_pieces_are_measured_from_the_file(ends_every_300):
    packed, _ = programs(ends_every_300)
    assert packed.document_pieces.by_length == ((256, 2),)
    unpacked = with_document_pieces(load_program_text(schedule(str(ends_every_300), document_end="")))
    assert unpacked.document_pieces is None


@pytest.mark.parametrize("stage", [0, 1])
def test_activations_and_workspace_grow_by_the_operators_padded_tokens(ends_every_300, stage):
    packed, plain = programs(ends_every_300)
    padded = packed.pipeline.microbatch_size * PADDED_TOKENS
    for chunk in range(CHUNKS):
        grown = chunk_activation_bytes(packed, stage, chunk) - chunk_activation_bytes(plain, stage, chunk)
        assert grown == pytest.approx(padded * 2 * GLA_OPERATOR_BYTES)
        grown = transient_bytes(packed, stage, chunk) - transient_bytes(plain, stage, chunk)
        assert grown == pytest.approx(padded * (GLA_OPERATOR_BYTES + GLA_RECOMPUTED_STATE_BYTES))


def test_mixer_recompute_keeps_no_operator_tensors_but_rebuilds_them(ends_every_300):
    packed, plain = programs(ends_every_300, recompute="mixer")
    padded = packed.pipeline.microbatch_size * PADDED_TOKENS
    assert chunk_activation_bytes(packed, 0, 1) == chunk_activation_bytes(plain, 0, 1)
    grown = transient_bytes(packed, 0, 1) - transient_bytes(plain, 0, 1)
    assert grown == pytest.approx(padded * (2 * GLA_OPERATOR_BYTES + GLA_RECOMPUTED_STATE_BYTES))


def test_recurrent_flops_grow_by_the_padded_tokens(ends_every_300):
    packed, plain = programs(ends_every_300)
    padded_flops = packed.pipeline.microbatch_size * PADDED_TOKENS * 2 * GLA_RECURRENCE_FLOPS
    packed_model, plain_model = FlopsCostModel(packed), FlopsCostModel(plain)
    throughput = packed_model.hardware.throughput_flops
    for stage in range(2):
        for chunk in range(CHUNKS):
            grown = packed_model.forward_seconds[stage][chunk] - plain_model.forward_seconds[stage][chunk]
            assert grown * throughput == pytest.approx(padded_flops)


def test_the_peak_rises_with_the_padding(ends_every_300):
    packed, plain = programs(ends_every_300)
    orders = stage_orders(packed)
    for with_padding, without in zip(predict_memory(packed, orders), predict_memory(plain, orders)):
        assert with_padding.allocated > without.allocated


def test_fit_evaluates_each_candidate_with_its_own_padding(ends_every_300):
    program = load_program_text(schedule(str(ends_every_300)))
    cost = CostSettings(CostModelKind.FLOPS)
    candidate = evaluate(program, 2048, 2, cost)
    variant = with_document_pieces(revise(program, **{"sequence.length": 2048, "sequence.chunks": 2}))
    assert variant.document_pieces.by_length == ((1024, 5),)  # 1023 tokens hold four ends 300 apart: 5 pieces
    expected = tuple(stage.reserved for stage in predict_memory(variant, stage_orders(variant)))
    assert candidate.reserved == pytest.approx(expected)
    plain = evaluate(load_program_text(schedule(str(ends_every_300), document_end="")), 2048, 2, cost)
    assert all(packed > unpacked for packed, unpacked in zip(candidate.reserved, plain.reserved))


def test_simulate_says_what_the_padding_bound_is(tmp_path, ends_every_300):
    path = tmp_path / "packed.sched"
    path.write_text(schedule(str(ends_every_300)))
    command = [sys.executable, "-m", "schedlang", "simulate", str(path)]
    table = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    assert "up to 2 pieces in a chunk of 256 tokens" in table.stdout and "320 tokens per sequence" in table.stdout
    result = json.loads(subprocess.run(command + ["--json"], capture_output=True, text=True, timeout=300).stdout)
    assert result["document_pieces"] == [{"chunk_length": 256, "pieces": 2, "operator_tokens": 256 + PADDED_TOKENS}]


def test_fit_says_what_padding_its_proposal_includes(tmp_path, ends_every_300):
    path = tmp_path / "packed.sched"
    path.write_text(schedule(str(ends_every_300)))
    command = [sys.executable, "-m", "schedlang", "simulate", str(path), "--fit", "--step", "1024",
               "--max-length", "2048", "--max-chunks", "2"]
    table = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    # the proposal is 2048 tokens in 1 or 2 chunks: 2047 tokens hold seven ends 300 apart, 1023 four
    assert ("up to 8 pieces in a chunk of 2048 tokens" in table.stdout) != (
        "up to 5 pieces in a chunk of 1024 tokens" in table.stdout
    )
    result = json.loads(subprocess.run(command + ["--json"], capture_output=True, text=True, timeout=300).stdout)
    pieces = {candidate["n_chunks"]: candidate["document_pieces"] for candidate in result["tried"]
              if candidate["length"] == 2048}
    assert pieces[1] == [{"chunk_length": 2048, "pieces": 8, "operator_tokens": 2048 + 7 * 64}]
    assert pieces[2] == [{"chunk_length": 1024, "pieces": 5, "operator_tokens": 1024 + 4 * 64}]
