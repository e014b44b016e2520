"""Softmax attention under sequence parallelism in the cost model and the balanced cut: a chunk costs what its
slowest rank (the last, whose queries see every earlier rank's keys) costs, plus each attention layer's K/V
exchange (all-gather or ring); StateFlow's balanced cut equalises that cost."""

from __future__ import annotations

import pytest

from schedlang.compiler import Pass, ScheduleText, compile_schedule
from schedlang.lowering.cost import (
    FlopsCostModel,
    Hardware,
    allgather_seconds,
    attention_pairs,
    last_rank_square_share,
    state_scan_seconds,
)
from schedlang.lowering.memory_terms import key_value_exchange_bytes, sequence_parallel_bytes
from schedlang.lowering.partition import balanced_boundaries
from schedlang.vocabulary import AttentionExchange, SequenceParallelMethod

HYBRID = """schedule hybrid_sequence_parallel
model {{ vocab = 256  d_model = 256  heads = 4  head_dim = 64  layers = [gla, attn] * 2  mlp = swiglu(ratio = 2) }}
mesh {{ pipeline = 1  sequence = {sequence} }}
sequence {{ length = 65536  chunks = 4  kernel_chunk = 64  partition = {partition}  parallel = allgather  attention = {attention} }}
pipeline {{ microbatches = 1 }}
"""


def program_of(sequence: int, partition: str, attention: str = "allgather"):
    text = HYBRID.format(sequence=sequence, partition=partition, attention=attention)
    return compile_schedule(ScheduleText(text, "hybrid.sched"), through=Pass.LEGALITY).program


def brute_force_pairs(prefix: int, tokens: int, ranks: int) -> list[float]:
    """Each rank's causal pairs, counted key by key (a query sees itself, half a pair as in Eq. 9's s^2 / 2)."""
    width = tokens // ranks
    pairs = []
    for rank in range(ranks):
        first = prefix + rank * width
        pairs.append(sum(query - 0.5 for query in range(first + 1, first + width + 1)) + 0.0)
    return pairs


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("prefix, tokens", [(0, 48), (96, 24), (1000, 120)])
def test_attention_pairs_are_the_last_ranks_and_sum_to_eq_9(ranks, prefix, tokens):
    per_rank = brute_force_pairs(prefix, tokens, ranks)
    assert attention_pairs(prefix, tokens, ranks) == pytest.approx(max(per_rank)) == pytest.approx(per_rank[-1])
    assert sum(per_rank) == pytest.approx(prefix * tokens + tokens * tokens / 2)
    share = last_rank_square_share(ranks)
    assert attention_pairs(prefix, tokens, ranks) == pytest.approx((prefix * tokens + share * tokens**2) / ranks)


def test_the_kv_all_gather_is_in_the_sequence_parallel_time():
    program = program_of(2, "uniform")
    hardware = Hardware()
    model = FlopsCostModel(program, hardware)
    tokens = program.sequence.chunk_length(0)
    key_value_bytes = 2 * program.pipeline.microbatch_size * (tokens // 2) * 4 * 64 * 4
    # the all-gather sends each gla layer's state and its decay per key row, float32
    state_bytes = program.pipeline.microbatch_size * 4 * 64 * (64 + 1) * 4
    expected = 2 * state_scan_seconds(SequenceParallelMethod.ALLGATHER, 2, 1, state_bytes, hardware)
    expected += 2 * allgather_seconds(2, key_value_bytes, hardware)
    assert model._sequence_parallel_seconds(0, tokens, attention_layers=2) == pytest.approx(expected)


def test_the_ring_pays_a_latency_per_step_and_holds_two_slices_in_flight():
    """On 4 ranks the ring's 3 steps cost one latency more than the all-gather's ceil(log2 4) = 2 per attention
    layer (the bandwidth terms are equal), and it holds 2 of the chunk's 4 slices in flight instead of all 4."""
    ranks, hardware = 4, Hardware()
    programs = {exchange: program_of(ranks, "uniform", exchange.value) for exchange in AttentionExchange}
    for exchange, program in programs.items():
        assert program.sequence.attention is exchange
    tokens = programs[AttentionExchange.RING].sequence.chunk_length(0)
    seconds = {
        exchange: FlopsCostModel(program, hardware)._sequence_parallel_seconds(0, tokens, attention_layers=2)
        for exchange, program in programs.items()
    }
    difference = seconds[AttentionExchange.RING] - seconds[AttentionExchange.ALLGATHER]
    assert difference == pytest.approx(2 * hardware.latency_s)
    whole_chunk = 2 * programs[AttentionExchange.RING].pipeline.microbatch_size * tokens * 4 * 64 * 4  # K and V, fp32
    assert key_value_exchange_bytes(programs[AttentionExchange.ALLGATHER], 0) == whole_chunk
    assert key_value_exchange_bytes(programs[AttentionExchange.RING], 0) == whole_chunk / 2
    assert sequence_parallel_bytes(programs[AttentionExchange.RING], 0, 0) == whole_chunk / 2
    two_ranks = {exchange: program_of(2, "uniform", exchange.value) for exchange in AttentionExchange}
    assert key_value_exchange_bytes(two_ranks[AttentionExchange.RING], 0) == key_value_exchange_bytes(
        two_ranks[AttentionExchange.ALLGATHER], 0
    )


def test_balanced_cut_equalises_the_slowest_ranks_cost():
    """alpha = 1 under sequence = 2: the chunks' forward times (the last rank's) agree within the rounding to
    kernel chunks, and the cut differs from the one balanced for a single device."""
    balanced = FlopsCostModel(program_of(2, "balanced(alpha = 1)"), Hardware(latency_s=0.0, bandwidth_bytes_per_s=1e30))
    seconds = balanced.forward_seconds[0]
    assert max(seconds) / min(seconds) < 1.02, seconds
    single_device_cut = balanced_boundaries(65536, 4, 1.0, 128, 2, 2, *_coefficients(balanced.program))
    assert balanced.program.sequence.boundaries != single_device_cut
    # the last rank's own triangle weighs more than Eq. 9's s^2 / 2, and most in the longest (first) chunks
    assert all(cut < single for cut, single in zip(balanced.program.sequence.boundaries[1:-1], single_device_cut[1:-1]))


def _coefficients(program) -> tuple[float, float, float]:
    from schedlang.lowering.partition import layer_flop_coefficients

    coefficients = layer_flop_coefficients(program.model, program.sequence.kernel_chunk)
    return coefficients.linear_cost_per_token, coefficients.dense_cost_per_token, coefficients.softmax_cost_per_pair


def test_one_rank_keeps_the_closed_form_cut():
    """sequence = 1 takes Eq. 10's closed form; the bisection agrees with it."""
    from schedlang.lowering.partition import _hybrid_boundary, _sequence_parallel_boundaries

    closed = [_hybrid_boundary(index / 4, 65536, 3.0, 0.01) for index in range(1, 4)]
    assert _sequence_parallel_boundaries(65536, 4, 3.0, 0.01, last_rank_square_share(1)) == pytest.approx(closed)
