"""Saved activations kept in pinned host memory between a chunk's forward and its backward (``pipeline.offload``).

[Note: activation offload]
With ``pipeline { offload = true }`` every chunk forward that keeps its graph runs inside
:meth:`ActivationOffload.saving`, a pair of ``torch.autograd.graph.saved_tensors_hooks`` (torch's own
``save_on_cpu`` is the model): each tensor autograd saves for the chunk's backward is copied into a pinned
host buffer on a side stream, which first waits for the compute stream, so the copies overlap the rest of
the forward; the device tensor is marked as used by that stream (``record_stream``), so the caching
allocator frees it as soon as the graph drops it yet reuses its memory only after the copy. Before the
chunk's backward the executor calls :meth:`ActivationOffload.prefetch` for it and for the next backward of
its action list: the host-to-device copies are queued on the side stream ahead of the compute that needs
them, and the unpack hook makes the compute stream wait for them. :meth:`ActivationOffload.release` drops
the chunk after its backward.

Which chunks move is the action list's (``offload_copies`` in schedlang.vocabulary.actions, which the cost and
memory models read too): a chunk whose forward is directly followed by its own backward (the last forward
before the first backward, in every order) keeps what it saves on the device. Copied out and straight back,
those tensors would only delay that backward, which would wait for the whole copy back: on one H100 the 3:1
hybrid at 64K in two offloaded chunks ran 2.80 s a step against 2.18 s predicted with both copies hidden
(docs/benchmarks.md, "1M and the hybrid against one H100"). Every other chunk's copy back is prefetched by the
backward before its own, except the first backward of a list when its chunk was copied out.

What stays on the device: tensors whose storage the ``resident`` predicate names (the executor's:
parameters, and the sequence-wide K/V buffers, [Note: sequence-wide K/V] in
:mod:`schedlang.runtime.kv_buffers`, which stay on the device anyway) and tensors on another device. A tensor
saved several times (one input of the q, k and v projections, each flattening it to rows anew) is copied once,
as long as it, or the tensor it is a view of, lives.

On the CPU there is no host memory to move to: the hooks run the same bookkeeping (pack, prefetch, unpack,
release) with the tensors themselves as the "copies", so the results are exactly those without offload.

Host memory. Every chunk in flight holds its copies from its forward to the end of its backward, so a rank pins
the saved activations of all its chunks in flight at once: at long sequences more than the host has
(``schedlang simulate`` predicts each node's sum, schedlang.lowering.memory_budget, and ``tune`` never picks a
schedule over it). Pinned memory cannot be swapped out, so a run past it thrashes instead of failing. On CUDA
the offload therefore reads ``MemAvailable`` once when it is built (:class:`PinnedBudget`: an equal share for
each of the node's ``LOCAL_WORLD_SIZE`` ranks, which cannot see each other's copies) and raises
:class:`PinnedMemoryExhaustedError` before a copy would take its copies past it; the trainer reports it as one
line. On the CPU there is no budget unless one is given. On CUDA the copies are laid in :class:`PinnedSlabs`,
blocks of pinned memory that chunks fill and give back whole, so that a copy is not rounded up to a power of two
by PyTorch's host allocator; the budget and the memory model count the copies' own bytes, which the slabs
exceed by a slab or two per chunk in flight.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from schedlang.runtime.host_memory import available_memory_bytes

GIB = 2**30


class PinnedMemoryExhaustedError(RuntimeError):
    """Activation offload would pin more host memory than the host had available (:class:`PinnedBudget`)."""


@dataclass
class PinnedBudget:
    """The host memory this rank's offload may pin (``available`` bytes), what its copies hold now (``pinned``) and
    at most so far (``most``)."""

    available: int
    pinned: int = 0
    most: int = 0  # the largest ``pinned`` so far

    @classmethod
    def of_this_host(cls) -> PinnedBudget | None:
        """``MemAvailable`` now, shared equally by the node's ranks (``LOCAL_WORLD_SIZE``, torchrun's); None where
        the system does not say."""
        available = available_memory_bytes()
        if available is None:
            return None
        ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)
        return cls(available // ranks)

    def take(self, n_bytes: int, chunk: Hashable) -> None:
        """Count ``n_bytes`` more of ``chunk``'s copies, or raise :class:`PinnedMemoryExhaustedError` when they
        would not fit (nothing is counted then)."""
        needed = self.pinned + n_bytes
        if needed > self.available:
            raise PinnedMemoryExhaustedError(
                f"pipeline.offload needs {needed / GIB:.2f} GiB of pinned host memory for this rank's saved "
                f"activations so far (at microbatch and chunk {chunk}), but the host had "
                f"{self.available / GIB:.2f} GiB available for it when the run started (MemAvailable, shared by "
                "the node's ranks); every chunk in flight waits there until its backward. Use recompute = full "
                "(it keeps only each chunk's input and needs no offload) or fewer tokens per sequence; "
                "`schedlang simulate FILE` predicts each node's pinned host memory"
            )
        self.pinned = needed
        self.most = max(self.most, needed)

    def give_back(self, n_bytes: int) -> None:
        self.pinned -= n_bytes


FIRST_SLAB_BYTES = 2**23
"""A chunk's first slab (8 MiB); each next one is twice the last, up to :data:`LARGEST_SLAB_BYTES`."""

LARGEST_SLAB_BYTES = 2**30

SLAB_ALIGNMENT = 512
"""Where a copy may start inside a slab: every dtype's element size divides it."""


@dataclass
class _Slab:
    memory: torch.Tensor  # one-dimensional uint8
    used: int = 0


def _power_of_two_at_least(n_bytes: int) -> int:
    return 1 << max(n_bytes - 1, 0).bit_length()


class PinnedSlabs:
    """Host memory for offload's copies, in slabs that the chunks fill and give back whole.

    PyTorch's host allocator rounds every pinned block up to a power of two, so one block per copy pins up to
    twice the copies' bytes (on one H100 the 1B hybrid at 64K in two chunks split by alpha 0.5: 48.9 GiB for the
    22.8 GiB the memory model counts, docs/benchmarks.md). Here every slab's size is a power of two, and a copy
    is a view into the first slab of its chunk that has room. When none has, the chunk takes a new slab twice
    the size of its last (the first :data:`FIRST_SLAB_BYTES`, at most :data:`LARGEST_SLAB_BYTES`, or the power of
    two that holds the copy when that is more): a small chunk pins little, a large one at most its bytes plus
    about two of the largest slabs. Slabs given back by released chunks are taken again by size (the side
    stream that wrote and read them orders a reuse after their last copy back), so later steps pin nothing new.
    ``first``, ``largest``: the slab sizes, powers of two; ``pin``: pinned host memory (False: pageable, for the
    CPU tests).
    """

    def __init__(self, first: int = FIRST_SLAB_BYTES, largest: int = LARGEST_SLAB_BYTES, pin: bool = True) -> None:
        self.first, self.largest, self.pin = first, largest, pin
        self.free: dict[int, list[torch.Tensor]] = {}  # slab size -> slabs given back
        self.held: dict[Hashable, list[_Slab]] = {}

    def tensor(self, key: Hashable, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous host tensor of ``shape`` and ``dtype`` in chunk ``key``'s slabs."""
        n_bytes = shape.numel() * dtype.itemsize
        slabs = self.held.setdefault(key, [])
        slab = next((slab for slab in slabs if slab.memory.numel() - slab.used >= n_bytes), None)
        if slab is None:
            size = min(2 * slabs[-1].memory.numel(), self.largest) if slabs else self.first
            size = max(size, _power_of_two_at_least(n_bytes))
            reusable = self.free.get(size)
            slab = _Slab(reusable.pop() if reusable else torch.empty(size, dtype=torch.uint8, pin_memory=self.pin))
            slabs.append(slab)
        start = slab.used
        slab.used = -(-(start + n_bytes) // SLAB_ALIGNMENT) * SLAB_ALIGNMENT
        return slab.memory[start:start + n_bytes].view(dtype).view(shape)

    def give_back(self, key: Hashable) -> None:
        """Chunk ``key``'s slabs are free for the next chunks (its copies are no longer read)."""
        for slab in self.held.pop(key, []):
            self.free.setdefault(slab.memory.numel(), []).append(slab.memory)

    @property
    def pinned_bytes(self) -> int:
        """What the slabs pin now, held by chunks or free."""
        held = sum(slab.memory.numel() for slabs in self.held.values() for slab in slabs)
        return held + sum(size * len(slabs) for size, slabs in self.free.items())


def storage_key(tensor: torch.Tensor) -> int:
    """The address of ``tensor``'s storage: the same for every view of it."""
    return tensor.untyped_storage().data_ptr()


@dataclass
class OffloadedChunk:
    """What one chunk's forward saved: host copies, then (after ``prefetch``) their device copies."""

    host: list[torch.Tensor] = field(default_factory=list)
    # a saved view's identity -> its copy's index, and the tensor copied (weakly)
    index_of: dict[tuple, tuple[int, weakref.ref]] = field(default_factory=dict)
    device: list[torch.Tensor] | None = None
    fetched: torch.cuda.Event | None = None  # the side stream's event after the host-to-device copies
    key: Hashable = None  # the executor's (microbatch, chunk)

    @property
    def host_bytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in self.host)


@dataclass(frozen=True, eq=False)
class _HostSaved:
    """The packed form of a saved tensor: its chunk and its place among that chunk's copies."""

    chunk: OffloadedChunk
    index: int


@dataclass
class OffloadCounts:
    """How often the hooks ran: what the CPU tests check, since there offload moves nothing."""

    packed: int = 0  # saved tensors handed to the pack hook
    copied: int = 0  # of those, the ones given a host copy (the rest stayed resident or were duplicates)
    unpacked: int = 0
    prefetched_chunks: int = 0


class ActivationOffload:
    """The saved tensors of the chunks between their forward and their backward, in host memory.

    ``device``: the compute device. ``resident(tensor)``: whether a saved tensor stays where it is
    (see the note). Chunks are named by any hashable key, the executor's ``(microbatch, chunk)``. ``budget``:
    the host memory its copies may take; on CUDA without one, :meth:`PinnedBudget.of_this_host`, on the CPU
    none (the note, "Host memory").
    """

    def __init__(
        self, device: torch.device, resident: Callable[[torch.Tensor], bool], budget: PinnedBudget | None = None
    ) -> None:
        self.device = device
        self.resident = resident
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.budget = budget if budget is not None or self.stream is None else PinnedBudget.of_this_host()
        self.slabs = PinnedSlabs() if self.stream is not None else None
        self.chunks: dict[Hashable, OffloadedChunk] = {}
        self.counts = OffloadCounts()

    @contextmanager
    def saving(self, key: Hashable) -> Iterator[OffloadedChunk]:
        """Run a chunk's forward inside this block: what autograd saves goes to the host."""
        if key in self.chunks:
            raise RuntimeError(f"chunk {key} was offloaded twice without a backward between")
        chunk = self.chunks[key] = OffloadedChunk(key=key)
        with torch.autograd.graph.saved_tensors_hooks(lambda tensor: self._pack(chunk, tensor), self._unpack):
            yield chunk

    def prefetch(self, key: Hashable) -> None:
        """Queue the copies of ``key``'s saved tensors back to the device; nothing when they are queued already
        or the chunk has not run its forward (yet)."""
        chunk = self.chunks.get(key)
        if chunk is not None and chunk.device is None:
            self._fetch(chunk)

    def _fetch(self, chunk: OffloadedChunk) -> None:
        self.counts.prefetched_chunks += 1
        if self.stream is None:
            chunk.device = chunk.host
            return
        compute = torch.cuda.current_stream(self.device)
        # allocated on the compute stream, which reads them; the side stream writes them after what came before
        chunk.device = [torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device) for tensor in chunk.host]
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            for device_tensor, host_tensor in zip(chunk.device, chunk.host):
                device_tensor.copy_(host_tensor, non_blocking=True)
            chunk.fetched = self.stream.record_event()

    def release(self, key: Hashable) -> None:
        """Forget ``key``'s copies (after its backward)."""
        chunk = self.chunks.pop(key, None)
        if chunk is not None and self.budget is not None:
            self.budget.give_back(chunk.host_bytes)
        if chunk is not None and self.slabs is not None:
            chunk.host = []
            self.slabs.give_back(key)

    def _pack(self, chunk: OffloadedChunk, tensor: torch.Tensor) -> torch.Tensor | _HostSaved:
        self.counts.packed += 1
        if tensor.device.type != self.device.type or self.resident(tensor):
            # a leaf (a parameter) comes back as itself; anything else detached, since a saved output returned
            # as itself would hold its own grad_fn in a reference cycle
            return tensor if tensor.grad_fn is None else tensor.detach()
        identity = (storage_key(tensor), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                    tensor.dtype, tensor._version)
        index, copied = chunk.index_of.get(identity, (None, None))
        # an address names the same data only while the tensor that owns it lives: once it is freed, the
        # allocator may give its memory to a new tensor of the same shape. A view (a linear layer's input
        # flattened to rows, made anew by each layer that reads it) dies at once, so the owner is its base
        if index is None or copied() is None:
            if self.budget is not None:
                self.budget.take(tensor.numel() * tensor.element_size(), chunk.key)
            index = len(chunk.host)
            owner = tensor if tensor._base is None else tensor._base
            chunk.index_of[identity] = (index, weakref.ref(owner))
            chunk.host.append(self._copy_to_host(tensor, chunk.key))
            self.counts.copied += 1
        return _HostSaved(chunk, index)

    def _copy_to_host(self, tensor: torch.Tensor, key: Hashable) -> torch.Tensor:
        if self.stream is None:
            return tensor.detach()
        host = self.slabs.tensor(key, tensor.shape, tensor.dtype)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(self.stream)
        return host

    def _unpack(self, packed: torch.Tensor | _HostSaved) -> torch.Tensor:
        self.counts.unpacked += 1
        if isinstance(packed, torch.Tensor):
            return packed
        chunk = packed.chunk
        if chunk.device is None:  # not prefetched: fetch now
            self._fetch(chunk)
        if chunk.fetched is not None:
            torch.cuda.current_stream(self.device).wait_event(chunk.fetched)
        return chunk.device[packed.index]
