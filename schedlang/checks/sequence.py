"""The ``sequence`` block: readers of its structured values, and its spec.

Contract: the readers follow ``schedlang.checks.readers``. They check each
value on its own; how the chunks relate to the length, the kernel chunk and the
mesh ([Note: sequence-parallel alignment]) is checked by the rules in
``schedlang.checks.rules``, which record the boundaries and the partition they
settle in ``checker.derived``. :func:`build_sequence` is pure.

[Note: sequence-parallel alignment]
With ``mesh.sequence = S`` every pipeline chunk is split contiguously over the
S ranks of its sequence-parallel group, each rank taking an equal run of whole
kernel chunks. So every chunk length, and therefore the sequence length, must be
a multiple of ``S * kernel_chunk``, and chunk boundaries are placed in units of
``S * kernel_chunk`` (for S = 1 this is the plain kernel-chunk rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedlang import ast
from schedlang.checks.readers import read_call, read_integer, read_number
from schedlang.lowering.program import SequenceSpec
from schedlang.vocabulary import PartitionKind, SequenceParallelMethod
from schedlang.vocabulary.model_settings import MAX_HEAD_DIM

if TYPE_CHECKING:
    from schedlang.checks.context import Checker

MAX_LENGTH = 1 << 31
MAX_KERNEL_CHUNK = 1 << 16
MAX_BALANCE_ALPHA = 4.0
# balanced() without alpha: the FLOP-balanced cut of StateFlow Eq. 10.
DEFAULT_BALANCE_ALPHA = 1.0


def read_kernel_chunk(checker: Checker, value: ast.Value, path: str) -> int | None:
    """A power of two in ``1 .. MAX_KERNEL_CHUNK``."""
    kernel_chunk = read_integer(checker, value, path, 1, MAX_KERNEL_CHUNK)
    if kernel_chunk is not None and kernel_chunk & (kernel_chunk - 1):
        checker.error(
            f"'{path}' must be a power of two, found {kernel_chunk}",
            value.span,
            hint=f"the kernels tile the sequence in power-of-two blocks; try {1 << (kernel_chunk.bit_length() - 1)} or {1 << kernel_chunk.bit_length()}",
        )
        return None
    return kernel_chunk


def read_partition(checker: Checker, value: ast.Value, path: str) -> tuple[PartitionKind, float | None] | None:
    """``uniform``, ``balanced(alpha = a)`` with ``0 <= a <= MAX_BALANCE_ALPHA``, or ``explicit``."""
    signatures = {
        PartitionKind.UNIFORM.value: (),
        PartitionKind.BALANCED.value: ("alpha",),
        PartitionKind.EXPLICIT.value: (),
    }
    call = read_call(checker, value, path, signatures, "partition")
    if call is None:
        return None
    kind = PartitionKind(call.name)
    if kind is not PartitionKind.BALANCED:
        return kind, None
    if "alpha" not in call.arguments:
        return kind, DEFAULT_BALANCE_ALPHA
    alpha_value = call.arguments["alpha"].value
    alpha = read_number(checker, alpha_value, f"{path}.alpha", 0.0)
    if alpha is None:
        return None
    if alpha > MAX_BALANCE_ALPHA:
        checker.error(
            f"'alpha' must be <= {MAX_BALANCE_ALPHA:g}, found {alpha:g}",
            alpha_value.span,
            hint="alpha = 0 is equal chunking, 1 the FLOP-balanced cut, values a little above 1 overshoot",
        )
        return None
    return kind, alpha


def read_parallel(checker: Checker, value: ast.Value, path: str) -> tuple[SequenceParallelMethod, int] | None:
    """``allscan(blocks = k)``, ``ring`` or ``allgather``: the method and All-Scan's block count."""
    signatures = {
        SequenceParallelMethod.ALLSCAN.value: ("blocks",),
        SequenceParallelMethod.RING.value: (),
        SequenceParallelMethod.ALLGATHER.value: (),
    }
    call = read_call(checker, value, path, signatures, "sequence-parallel method")
    if call is None:
        return None
    method = SequenceParallelMethod(call.name)
    if "blocks" not in call.arguments:
        return method, SequenceSpec.scan_blocks
    blocks = read_integer(checker, call.arguments["blocks"].value, f"{path}.blocks", 1, MAX_HEAD_DIM)
    return None if blocks is None else (method, blocks)


def read_chunks(checker: Checker, value: ast.Value, path: str) -> int | tuple[int, ...] | None:
    """A chunk count ``N``, or a list of at least two boundaries (their relation to the length is a rule's)."""
    if not isinstance(value, ast.ListLiteral):
        return read_integer(checker, value, path, 1, MAX_LENGTH)
    numbers = [read_integer(checker, item, f"a boundary in {path}", 0, MAX_LENGTH) for item in value.items]
    if None in numbers:
        return None
    if len(numbers) < 2:
        checker.error(
            f"'{path}' must list at least two boundaries, 0 and the length",
            value.span,
            hint="e.g. `chunks = [0, 1024, 2560, 4096]`",
        )
        return None
    return tuple(numbers)


def build_sequence(checker: Checker) -> SequenceSpec | None:
    """The spec, from the keys and what the rules derived (partition, boundaries)."""
    if not checker.valid("sequence.length", "sequence.kernel_chunk", "sequence.parallel", "sequence.attention"):
        return None
    partition = checker.derived.get("sequence.partition")
    boundaries = checker.derived.get("sequence.boundaries")
    if partition is None or boundaries is None:
        return None
    method, scan_blocks = checker.get("sequence.parallel")
    return SequenceSpec(
        length=checker.get("sequence.length"),
        boundaries=boundaries,
        kernel_chunk=checker.get("sequence.kernel_chunk"),
        partition=partition[0],
        balance_alpha=partition[1],
        parallel=method,
        scan_blocks=scan_blocks,
        attention=checker.get("sequence.attention"),
    )
