"""``sequence.attention``: how attention layers exchange key/value slices across the sequence-parallel group."""

import pytest

from schedlang.frontend import load_program_text
from schedlang.vocabulary import AttentionExchange

from .helpers import VALID, only_diagnostic, replace_line

KERNEL_CHUNK_LINE = 15  # "  kernel_chunk = 64" inside the sequence block of VALID


def with_sequence_keys(keys: str) -> str:
    return replace_line(VALID, KERNEL_CHUNK_LINE, f"  kernel_chunk = 64  {keys}")


@pytest.mark.parametrize("word", ["allgather", "ring"])
def test_each_exchange_is_read_into_the_sequence_spec(word):
    program = load_program_text(with_sequence_keys(f"attention = {word}"), "t.sched")
    assert program.sequence.attention is AttentionExchange(word)


def test_the_default_is_the_all_gather():
    assert load_program_text(VALID, "t.sched").sequence.attention is AttentionExchange.ALLGATHER


def test_an_unknown_exchange_is_reported_at_its_word():
    text = with_sequence_keys("attention = rign")
    column = text.split("\n")[KERNEL_CHUNK_LINE - 1].index("rign") + 1
    assert only_diagnostic(text) == (KERNEL_CHUNK_LINE, column, "unknown attention exchange 'rign'")


def test_a_call_is_refused_with_the_accepted_words():
    text = with_sequence_keys("attention = ring(steps = 2)")
    column = text.split("\n")[KERNEL_CHUNK_LINE - 1].index("ring(") + 1
    assert only_diagnostic(text) == (
        KERNEL_CHUNK_LINE,
        column,
        "'sequence.attention' must be one of allgather or ring, found 'ring(steps = 2)'",
    )
