"""What a schedule's predicted memory must fit, and the one rule that says whether it does.

Contract. A :class:`MemoryBudget` is one device's memory and one node's host memory
(:class:`~schedlang.lowering.hardware_profile.HostMemory`, shared by the node's ``gpus_per_node`` GPUs).
:meth:`MemoryBudget.misfits` takes a checked program and its per-stage memory (the memory pass's product,
:mod:`schedlang.lowering.memory_peak`) and returns every :class:`Misfit`, worst first:

* device: a stage whose predicted reserved peak plus :data:`OUTSIDE_THE_ALLOCATOR` exceeds the device memory;
  its binding term is the stage's largest component;
* host: a node whose ranks' pinned host bytes together (``StageMemory.pinned_host`` of each rank's stage:
  offloaded activations, ``pipeline.offload``) exceed ``HostMemory.pinned_limit``; its binding term is the
  offloaded activations of the stage that holds the most of them there.

A schedule fits when there is none. ``simulate`` (its memory table and ``--fit``) and ``tune`` ask this and
nothing else, so they agree on what fits. Ranks are laid out pipeline x sequence x data, row-major (as
schedlang.runtime.mesh builds them), and fill nodes of ``gpus_per_node`` in rank order, as the profile cost
model places them (schedlang.lowering.profile_cost); without a hardware profile a node is one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from schedlang.lowering.hardware_profile import HardwareProfile, HostMemory

if TYPE_CHECKING:  # the commands import this module to build their parsers: no memory model until it is used
    from schedlang.lowering.memory_peak import StageMemory
    from schedlang.lowering.program import ScheduleProgram

GIB = 2**30

OUTSIDE_THE_ALLOCATOR = 1.5 * GIB
"""Device memory a training process uses outside PyTorch's caching allocator, so that ``max_memory_reserved``
does not see it: the CUDA context with its kernel images (cuBLAS, Triton's compiled kernels) and NCCL's
communicator buffers. An assumed allowance, like [Note: reserved memory] in schedlang.lowering.memory_peak."""

def holds_no_process(device_bytes: float) -> bool:
    """Whether a device is too small even for :data:`OUTSIDE_THE_ALLOCATOR`: then nothing can fit on it."""
    return device_bytes <= OUTSIDE_THE_ALLOCATOR


OFFLOADED_ACTIVATIONS = "offloaded activations"
"""The term that binds a node's host memory: the saved activations ``pipeline.offload`` keeps there."""


class MemoryPlace(str, Enum):
    """Where memory runs out: one device, or the host memory a node's GPUs share."""

    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True)
class Misfit:
    """Memory a schedule needs beyond its budget: ``needed`` bytes where ``limit`` are available, on one stage's
    device or one node's host; ``stage`` is that stage (host: the node's stage that offloads the most) and
    ``term`` what binds there, ``term_bytes`` its bytes (host: per rank)."""

    place: MemoryPlace
    stage: StageMemory
    node: int | None  # host: the node; None for the device
    needed: float
    limit: float
    term: str
    term_bytes: float
    host: HostMemory | None = None  # host: the budget's, for the message

    @property
    def overshoot(self) -> float:
        """How far over: ``needed / limit`` (above 1); the nearest miss has the smallest."""
        return self.needed / self.limit

    def describe(self) -> str:
        """What is needed where, and the term that binds: the words ``simulate`` and ``tune`` print."""
        if self.place is MemoryPlace.DEVICE and holds_no_process(self.limit):
            return (
                f"needs {self.needed / GIB:.2f} GiB on stage {self.stage.stage}, and the device's "
                f"{self.limit / GIB:.2f} GiB do not hold even the {OUTSIDE_THE_ALLOCATOR / GIB:g} GiB a process "
                "uses outside the allocator (the CUDA context and its kernel images)"
            )
        if self.place is MemoryPlace.DEVICE:
            return (
                f"needs {self.needed / GIB:.2f} GiB on stage {self.stage.stage} (with {OUTSIDE_THE_ALLOCATOR / GIB:g} "
                f"GiB outside the allocator), whose largest term is {self.term} ({self.term_bytes / GIB:.2f} GiB)"
            )
        host = self.host or HostMemory()
        return (
            f"needs {self.needed / GIB:.2f} GiB of pinned host memory on node {self.node}, over the "
            f"{self.limit / GIB:.2f} GiB pinned copies may take there ({host.pinned_fraction:.0%} of "
            f"{host.memory_bytes / GIB:.2f} GiB host memory), whose largest term is {self.term} of stage "
            f"{self.stage.stage} ({self.term_bytes / GIB:.2f} GiB per rank, pipeline.offload)"
        )


@dataclass(frozen=True)
class MemoryBudget:
    """One device's memory and one node's host memory, shared by ``gpus_per_node`` GPUs."""

    device_bytes: float
    host: HostMemory = HostMemory()
    gpus_per_node: int = 1

    @classmethod
    def of(cls, device_bytes: float, host_bytes: float | None, hardware) -> MemoryBudget:
        """The budget of a command: ``--device-memory``; ``--host-memory`` (None: the hardware profile's, else
        :class:`HostMemory`'s default) with the profile's pinned fraction and its ``gpus_per_node`` (a node is
        one GPU without a profile)."""
        profile = hardware if isinstance(hardware, HardwareProfile) else None
        host = profile.host_memory() if profile is not None else HostMemory()
        if host_bytes is not None:
            host = HostMemory(int(host_bytes), host.pinned_fraction)
        return cls(device_bytes, host, profile.topology.gpus_per_node if profile is not None else 1)

    def stage_fits(self, reserved: float) -> bool:
        """Whether a stage's predicted reserved peak fits the device."""
        return reserved + OUTSIDE_THE_ALLOCATOR <= self.device_bytes

    def stage_fits_host(self, pinned_host: float) -> bool:
        """Whether one rank's pinned host bytes fit a node by themselves (what the other ranks of the node add
        can only make it worse)."""
        return pinned_host <= self.host.pinned_limit

    def node_pinned_bytes(self, program: ScheduleProgram, memory: Sequence[StageMemory]) -> tuple[float, ...]:
        """Each node's pinned host bytes: the sum over its ranks of their stage's ``pinned_host``."""
        return tuple(sum(memory[stage].pinned_host for stage in stages) for stages in self.node_stages(program))

    def node_stages(self, program: ScheduleProgram) -> list[list[int]]:
        """The stage of each rank on each node (ranks row-major over pipeline x sequence x data)."""
        mesh = program.mesh
        replicas = mesh.sequence * mesh.data  # ranks per stage
        ranks = mesh.pipeline * replicas
        return [
            [rank // replicas for rank in range(first, min(first + self.gpus_per_node, ranks))]
            for first in range(0, ranks, self.gpus_per_node)
        ]

    def misfits(self, program: ScheduleProgram, memory: Sequence[StageMemory]) -> tuple[Misfit, ...]:
        """Every stage that does not fit its device and every node whose pinned host memory does not fit,
        the farthest over first."""
        found = []
        for stage in memory:
            if not self.stage_fits(stage.reserved):
                components = stage.components
                term = max(components, key=components.get)
                found.append(Misfit(
                    MemoryPlace.DEVICE, stage, None, stage.reserved + OUTSIDE_THE_ALLOCATOR, self.device_bytes,
                    term.value, components[term],
                ))
        limit = self.host.pinned_limit
        node_bytes = self.node_pinned_bytes(program, memory)
        for node, (stages, needed) in enumerate(zip(self.node_stages(program), node_bytes)):
            if needed > limit:
                largest = max(stages, key=lambda stage: memory[stage].pinned_host)
                found.append(Misfit(
                    MemoryPlace.HOST, memory[largest], node, needed, limit, OFFLOADED_ACTIVATIONS,
                    memory[largest].pinned_host, self.host,
                ))
        return tuple(sorted(found, key=lambda misfit: -misfit.overshoot))

    def fits(self, program: ScheduleProgram, memory: Sequence[StageMemory]) -> bool:
        return not self.misfits(program, memory)
