"""Short convolutions of a Gated DeltaNet or Mamba-2 layer, and the layer state that carries them across chunks.

[Note: short-convolution state]
A ``gdn`` layer with ``short_conv_size = W`` passes its projected queries, keys and values through a causal
depthwise convolution of ``W`` taps (flash-linear-attention's ``ShortConvolution``: no bias, then SiLU).
The output at token ``t`` reads the inputs ``t - W + 1 .. t``, so a chunk's first ``W - 1`` outputs need
the previous chunk's last ``W - 1`` inputs (zeros before the first chunk, which is the convolution's own
zero padding). Those inputs are part of the layer's state, next to the delta rule's ``[B, H, K, V]``
matrix. The executor's contract is one tensor per stateful layer ([Note: state passing] in
:mod:`schedlang.runtime.state_store`), so :class:`PackedDeltaState` packs both into one ``[B, n]`` tensor
in the recurrent state's dtype (float32 holds a bf16 or fp16 input exactly): the recurrent matrix
flattened, then the ``W - 1`` inputs of q, k and v. Gradients reach the previous chunk through the
packing as through any tensor, and an all-zero packed state means exactly "no state", as the CUDA-graph
replay of chunk 0 needs (``schedlang.runtime.graphs``). A layer without short convolutions keeps its bare
recurrent state.

[Note: short convolutions across sequence ranks]
With the chunk split over a sequence-parallel group, rank ``r``'s first outputs read rank ``r - 1``'s last
``W - 1`` inputs. :func:`sequence_parallel_histories` all-gathers every rank's last ``W - 1`` inputs (one
small collective per layer and chunk; each rank's slice holds at least ``W - 1`` tokens, which
``schedlang check`` ensures through ``kernel_chunk``): rank 0 starts from the incoming state's history,
rank ``r > 0`` from rank ``r - 1``'s inputs, and every rank returns the last rank's inputs as the history
after the chunk. That keeps the executor's rank contract for states ([Note: sequence-parallel chunks] in
:mod:`schedlang.runtime.executor`): the incoming history is read on rank 0 only, and the backward of the
gather sums the gradients every rank gives to a rank's inputs, the final history's included.

[Note: short convolutions over packed documents]
With packed documents ([Note: packed documents] in :mod:`schedlang.runtime.packing`) the output at token ``t``
reads only the inputs of ``t``'s own document: a tap that would read a position before the document's start
reads zero, as the convolution's zero padding does at a sequence's start. ``ShortConvolution`` then forms
each output from its ``size`` taps under a ``[rows, L, size]`` mask of the chunk's document starts
(:func:`document_taps`); the history it hands on is the last ``size - 1`` inputs as always, and the next
chunk's mask drops those that precede its first document's start. Masking is needed whenever a document
starts after the sequence's first position (``ChunkDocuments.masks_keys``), the first piece's history
included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from schedlang.kernels.short_convolution import short_convolution, short_convolution_history
from schedlang.runtime.mixer_base import kernel_backend
from schedlang.runtime.packing import ChunkDocuments


def document_taps(documents: ChunkDocuments, size: int, device: torch.device) -> torch.Tensor:
    """``[rows, L, size]``, True where tap ``j`` of the output at the chunk's token ``i`` (position
    ``start + i - size + 1 + j``) lies in that token's document ([Note: short convolutions over packed
    documents])."""
    length = documents.end - documents.start
    positions = documents.start + torch.arange(length)[:, None] + torch.arange(size)[None, :] - (size - 1)
    starts = documents.segment_ids()  # a row's first piece reads as starting at the chunk's start
    first_starts = torch.tensor(documents.first_starts)[:, None]
    starts = torch.where(starts == documents.start, torch.minimum(starts, first_starts), starts)
    return (positions[None] >= starts[:, :, None]).to(device)


class ShortConvolution(nn.Module):
    """``silu(causal depthwise conv1d)`` over ``[B, L, channels]``; ``weight`` is ``[channels, 1, size]``,
    fla's ``q_conv1d.weight`` layout, tap ``size - 1`` on the current token; ``bias`` (``[channels]``) only
    when asked for (Mamba-2's ``use_conv_bias``)."""

    def __init__(self, channels: int, size: int, bias: bool = False) -> None:
        super().__init__()
        self.channels = channels
        self.size = size
        self.weight = nn.Parameter(torch.empty(channels, 1, size))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None

    def forward(
        self, inputs: torch.Tensor, history: torch.Tensor | None, documents: ChunkDocuments | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``inputs`` ``[B, L, C]`` and the ``size - 1`` inputs before them (``[B, size - 1, C]``; None:
        zeros). Returns the output ``[B, L, C]`` and the last ``size - 1`` inputs, history included, for
        the next chunk (the chunk may be shorter than the history). With ``documents`` each output reads only
        its own document's inputs ([Note: short convolutions over packed documents])."""
        if documents is not None and documents.masks_keys:
            return self._convolve_documents(inputs, history, documents)
        history = None if history is None else history.to(inputs.dtype)
        backend = kernel_backend(inputs.device)
        output = short_convolution(inputs, self.weight[:, 0], self.bias, history, backend=backend)
        return output, short_convolution_history(inputs, history, self.size)

    def _convolve_documents(self, inputs, history, documents):
        """Each output from its ``size`` taps under the chunk's document mask (batched PyTorch)."""
        batch, _, channels = inputs.shape
        if history is None:
            history = inputs.new_zeros(batch, self.size - 1, channels)
        padded = torch.cat((history.to(inputs.dtype), inputs), dim=1)
        weight = self.weight.to(inputs.dtype)
        taps = document_taps(documents, self.size, inputs.device).to(inputs.dtype)
        windows = padded.unfold(1, self.size, 1)  # [B, L, C, size]
        mixed = (windows * taps[:, :, None, :] * weight[:, 0]).sum(dim=-1)
        mixed = mixed if self.bias is None else mixed + self.bias.to(inputs.dtype)
        return F.silu(mixed), padded[:, padded.shape[1] - (self.size - 1) :]


@dataclass(frozen=True)
class PackedDeltaState:
    """The layout of one ``gdn`` or ``mamba2`` layer's packed state ([Note: short-convolution state]): a
    recurrent state of ``recurrent_shape`` (without the batch), then ``history`` inputs of each of
    ``channels`` (gdn: q, k, v; mamba2: x, B and C as one convolution's channels)."""

    recurrent_shape: tuple[int, ...]
    history: int
    channels: tuple[int, ...]

    @property
    def recurrent_size(self) -> int:
        size = 1
        for extent in self.recurrent_shape:
            size *= extent
        return size

    def pack(self, recurrent: torch.Tensor, histories: tuple[torch.Tensor, ...]) -> torch.Tensor:
        batch = recurrent.shape[0]
        parts = [recurrent.reshape(batch, -1)]
        parts.extend(history.reshape(batch, -1).to(recurrent.dtype) for history in histories)
        return torch.cat(parts, dim=1)

    def unpack(self, state: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The recurrent state and each convolution's history, views of ``state``."""
        batch = state.shape[0]
        sizes = [self.recurrent_size] + [self.history * channels for channels in self.channels]
        recurrent, *flat = state.split(sizes, dim=1)
        histories = tuple(
            part.reshape(batch, self.history, channels) for part, channels in zip(flat, self.channels)
        )
        return recurrent.reshape(batch, *self.recurrent_shape), histories


class _ExchangeHistories(torch.autograd.Function):
    """``(starting, final)`` histories of this rank from every rank's last inputs (one all-gather): rank 0
    starts from ``incoming``, rank ``r > 0`` from rank ``r - 1``'s inputs, every rank ends with the last
    rank's. One node with both outputs, so the backward's one all-reduce (gloo has no reduce-scatter) runs
    at the same point of every rank's backward, whichever output a rank's graph uses."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, incoming: torch.Tensor, group: dist.ProcessGroup):
        ctx.group = group
        local = local.contiguous()
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, local, group=group)
        rank = dist.get_rank(group)
        starting = incoming.to(local.dtype).clone() if rank == 0 else gathered[rank - 1]
        ctx.incoming_dtype = incoming.dtype
        return starting, gathered[-1].clone()

    @staticmethod
    def backward(ctx, starting_gradient: torch.Tensor | None, final_gradient: torch.Tensor | None):
        group = ctx.group
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        reference = starting_gradient if starting_gradient is not None else final_gradient
        gradients = reference.new_zeros((ranks, *reference.shape))
        if final_gradient is not None:
            gradients[-1] += final_gradient
        if starting_gradient is not None and rank > 0:
            gradients[rank - 1] += starting_gradient
        dist.all_reduce(gradients, group=group)
        incoming = torch.zeros_like(reference, dtype=ctx.incoming_dtype)
        if starting_gradient is not None and rank == 0:
            incoming = starting_gradient.to(ctx.incoming_dtype)
        return gradients[rank], incoming, None


def sequence_parallel_histories(
    inputs: tuple[torch.Tensor, ...], histories: tuple[torch.Tensor, ...], group: dist.ProcessGroup
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The history each convolution starts from on this rank, and the history after the whole chunk
    ([Note: short convolutions across sequence ranks]). ``inputs`` are this rank's ``[B, L_r, C_i]``
    convolution inputs, ``histories`` the incoming state's ``[B, W - 1, C_i]`` (zeros before a sequence)."""
    history, length = histories[0].shape[1], inputs[0].shape[1]
    if history == 0:
        return histories, histories
    if length < history:
        raise ValueError(
            f"a sequence-parallel rank holds {length} tokens, fewer than the short convolution's {history} "
            "earlier inputs (schedlang check keeps kernel_chunk >= short_conv_size - 1)"
        )
    widths = [tensor.shape[-1] for tensor in inputs]
    local = torch.cat([tensor[:, length - history :] for tensor in inputs], dim=-1)
    starting, final = _ExchangeHistories.apply(local, torch.cat(histories, dim=-1), group)
    return tuple(starting.split(widths, dim=-1)), tuple(final.split(widths, dim=-1))
