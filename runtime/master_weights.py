"""fp32 master weights, gradients and optimizer state for a stage computed in a 16-bit dtype.

[Note: master weights]
With ``train.dtype = bf16 | fp16`` and ``train.master_weights`` (the default), the stage model that runs
holds its parameters in the 16-bit dtype and :class:`MasterWeights` holds an fp32 copy of each, under the
same names, with an fp32 ``.grad``:

* every ``B`` (and every deferred ``W``) leaves its chunk's weight gradients in the 16-bit ``.grad`` tensors;
  the executor then calls :meth:`MasterWeights.accumulate_gradients`, which adds them into the fp32
  gradients and zeroes the 16-bit ones in place, so the sum over a step's chunks and microbatches is formed
  in fp32 (a 16-bit sum drops the low bits of each small per-chunk term once the sum has grown);
* the data-parallel and sequence-parallel all-reduce, the gradient clip, the optimizer step (so the
  optimizer's state), the learning-rate schedule and the checkpoints see the fp32 copies;
* after each optimizer step (and each resume) :meth:`MasterWeights.copy_to_model` copies the fp32 values
  into the 16-bit parameters in place.

Why 16-bit parameters with fp32 copies (Megatron-LM's ``main_grad``) and not fp32 parameters cast to the
compute dtype where a layer reads them (autocast's way):

* the compute path is the one ``master_weights = false`` runs: the kernels, the chunk executor, the messages
  and states, the in-place weight-gradient GEMMs ([Note: in-place weight gradients] in
  schedlang.runtime.linear), deferred ``W`` tasks and CUDA graphs read and write 16-bit parameters and
  16-bit ``.grad`` tensors at fixed addresses; the copy after the step writes in place, so the graphs, which
  read parameter storages by address, see the new weights;
* casting at use would cast every weight again in each chunk's forward, and autograd would keep each cast
  for that chunk's backward: a 16-bit copy of the stage's weights per chunk in flight, where this keeps one.

The price: a 16-bit ``.grad`` per parameter besides the fp32 one (Megatron fuses the weight-gradient GEMM
into the fp32 gradient instead) and one addition per parameter per backward. The 16-bit ``.grad`` is zeroed
in place rather than dropped, which keeps the storage the CUDA graphs add into and makes the memory
model's gradient term (schedlang.lowering.memory_terms.static_bytes) hold throughout the step.
"""

from __future__ import annotations

import torch
from torch import nn


def _twin_module(model: nn.Module) -> nn.Module:
    """A module whose parameters have ``model``'s names and fp32 copies of its values.

    It is never run: it exists so that the optimizer and torch.distributed.checkpoint, which name parameters
    by their module paths, see the fp32 copies under the names of the model's parameters.
    """
    twin = nn.Module()
    owners: dict[str, nn.Module] = {"": twin}
    for name, parameter in model.named_parameters():
        *path, leaf = name.split(".")
        owner, prefix = twin, ""
        for part in path:
            prefix = f"{prefix}.{part}" if prefix else part
            if prefix not in owners:
                owners[prefix] = nn.Module()
                owner.add_module(part, owners[prefix])
            owner = owners[prefix]
        owner.register_parameter(leaf, nn.Parameter(parameter.detach().to(torch.float32, copy=True)))
    return twin


class MasterWeights:
    """fp32 copies of a stage's parameters and gradients: [Note: master weights].

    Built from the stage model while its parameters are still fp32 (the seed's initial values, unrounded),
    then casts the model to ``compute_dtype`` in place.
    """

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype) -> None:
        self.module = _twin_module(model)
        model.to(compute_dtype)
        self.model_parameters = list(model.parameters())
        self.master_parameters = list(self.module.parameters())

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates."""
        return self.master_parameters

    @torch.no_grad()
    def accumulate_gradients(self) -> None:
        """Add the 16-bit ``.grad`` tensors the last backward (or ``W``) formed into the fp32 ones, and zero
        them in place (their storage stays: CUDA graphs and in-place weight-gradient GEMMs add into it).

        An fp32 ``.grad`` is made (zeros) at its first use, not before: torch.distributed.checkpoint initialises
        an optimizer that has taken no step (a resume) only while its parameters have no ``.grad``."""
        pairs = []
        for master, parameter in zip(self.master_parameters, self.model_parameters):
            if parameter.grad is not None:
                if master.grad is None:
                    master.grad = torch.zeros_like(master)
                pairs.append((master.grad, parameter.grad))
        if pairs:
            master_gradients, gradients = (list(side) for side in zip(*pairs))
            torch._foreach_add_(master_gradients, gradients)
            torch._foreach_zero_(gradients)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """The fp32 values, rounded to the compute dtype, into the model's parameters in place."""
        torch._foreach_copy_(self.model_parameters, self.master_parameters)
