"""How many tokens a recurrent layer's fused call runs over for a chunk of packed documents: the padding rule of
[Note: packed documents] (:mod:`schedlang.runtime.packing`), written once for the runtime's layout
(:class:`schedlang.runtime.packing.PaddedRows`) and for the memory and cost models (schedlang.lowering).

No torch here, so that the models can import it.
"""

from __future__ import annotations


def padded_piece_tokens(piece_tokens: int, chunk_size: int) -> int:
    """The padded tokens a document piece that is not its row's last takes: the piece and its reset token,
    rounded up to a whole number of kernel chunks of ``chunk_size`` tokens. (A row's last piece takes its own
    ``piece_tokens``.)"""
    return -(-(piece_tokens + 1) // chunk_size) * chunk_size


def most_padded_tokens(chunk_tokens: int, pieces: int, chunk_size: int) -> int:
    """The longest padded row a chunk of ``chunk_tokens`` tokens can have when none of its rows holds more than
    ``pieces`` document pieces: the most the fused call's ``PaddedRows.length`` can be; ``chunk_tokens`` for
    one piece (the call then runs unpadded).

    A row of pieces ``n_1 .. n_p`` is ``sum(padded_piece_tokens(n_i)) + n_p`` long, i.e. ``chunk_tokens`` plus
    ``chunk_size - n_i mod chunk_size`` for each leading piece (``chunk_size`` when it divides ``n_i``). The
    most is taken with ``a`` leading pieces of ``chunk_size`` tokens and the others of one token:
    ``chunk_tokens + (p - 1) (chunk_size - 1) + a``, ``a = min(p - 1, (chunk_tokens - p) // (chunk_size - 1))``;
    so at most ``chunk_tokens + (p - 1) chunk_size``.
    """
    pieces = max(1, min(pieces, chunk_tokens))  # every piece holds a token
    if chunk_size == 1:
        return chunk_tokens + pieces - 1
    whole_chunks = min(pieces - 1, (chunk_tokens - pieces) // (chunk_size - 1))
    return chunk_tokens + (pieces - 1) * (chunk_size - 1) + whole_chunks
