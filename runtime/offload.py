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

What stays on the device: tensors whose storage the ``resident`` predicate names (the executor's:
parameters, and the sequence-wide K/V buffers, [Note: sequence-wide K/V] in
:mod:`schedlang.runtime.kv_buffers`, which stay on the device anyway) and tensors on another device. A tensor
saved several times (one input of the q, k and v projections) is copied once, as long as it lives.

On the CPU there is no host memory to move to: the hooks run the same bookkeeping (pack, prefetch, unpack,
release) with the tensors themselves as the "copies", so the results are exactly those without offload.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


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
    (see the note). Chunks are named by any hashable key, the executor's ``(microbatch, chunk)``.
    """

    def __init__(self, device: torch.device, resident: Callable[[torch.Tensor], bool]) -> None:
        self.device = device
        self.resident = resident
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.chunks: dict[Hashable, OffloadedChunk] = {}
        self.counts = OffloadCounts()

    @contextmanager
    def saving(self, key: Hashable) -> Iterator[OffloadedChunk]:
        """Run a chunk's forward inside this block: what autograd saves goes to the host."""
        if key in self.chunks:
            raise RuntimeError(f"chunk {key} was offloaded twice without a backward between")
        chunk = self.chunks[key] = OffloadedChunk()
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
        self.chunks.pop(key, None)

    def _pack(self, chunk: OffloadedChunk, tensor: torch.Tensor) -> torch.Tensor | _HostSaved:
        self.counts.packed += 1
        if tensor.device.type != self.device.type or self.resident(tensor):
            # a leaf (a parameter) comes back as itself; anything else detached, since a saved output returned
            # as itself would hold its own grad_fn in a reference cycle
            return tensor if tensor.grad_fn is None else tensor.detach()
        identity = (storage_key(tensor), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                    tensor.dtype, tensor._version)
        index, copied = chunk.index_of.get(identity, (None, None))
        # an address names the same data only while the tensor copied from it lives: once it is freed, the
        # allocator may give its memory to a new tensor of the same shape
        if index is None or copied() is None:
            index = len(chunk.host)
            chunk.index_of[identity] = (index, weakref.ref(tensor))
            chunk.host.append(self._copy_to_host(tensor))
            self.counts.copied += 1
        return _HostSaved(chunk, index)

    def _copy_to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.stream is None:
            return tensor.detach()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
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
