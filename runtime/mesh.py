"""Process groups for a pipeline x sequence x data device mesh, from torchrun's environment.

Ranks are laid out by torch's ``init_device_mesh`` with dimension names
``("pipeline", "sequence", "data")``: data-parallel replicas of one stage are
neighbouring ranks, and the pipeline peers of a rank share its sequence and
data coordinates.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from schedlang.runtime.lifetime import die_with_parent

MESH_DIMENSIONS = ("pipeline", "sequence", "data")


@dataclass
class RuntimeMesh:
    """This rank's place in the mesh and the groups it communicates in."""

    device_mesh: DeviceMesh
    device: torch.device
    rank: int
    world_size: int
    stage: int
    sequence_index: int
    data_index: int
    n_stages: int
    pipeline_group: dist.ProcessGroup
    sequence_group: dist.ProcessGroup
    data_group: dist.ProcessGroup
    previous_stage_rank: int | None
    next_stage_rank: int | None

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.n_stages - 1


def resolve_device(device_type: str) -> torch.device:
    """``cuda`` binds this process to its local GPU; anything else is the CPU."""
    if device_type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def require_launcher(world_size: int) -> None:
    """Exit with the torchrun command line when the process was started without torchrun's environment."""
    missing = [name for name in LAUNCHER_VARIABLES if name not in os.environ]
    if missing:
        import shlex
        import sys

        script = shlex.quote(sys.argv[0] or "train.py")
        raise SystemExit(
            f"{script}: error: this script is one rank of a {world_size}-process job and needs torchrun's "
            f"environment ({', '.join(missing)} not set); launch it with: "
            f"torchrun --nproc-per-node {world_size} {script}"
        )


def init_mesh(pipeline: int, sequence: int, data: int, device_type: str, timeout_s: float = 300.0) -> RuntimeMesh:
    """Join the job torchrun started and build the mesh; gloo on CPU, NCCL on CUDA.

    The world size must equal ``pipeline * sequence * data``: the schedule
    fixes the mesh, so a mismatched launch is an error rather than a resize.
    """
    if not dist.is_initialized():
        require_launcher(pipeline * sequence * data)
        die_with_parent()
    device = resolve_device(device_type)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    world_size = dist.get_world_size()
    expected = pipeline * sequence * data
    if world_size != expected:
        raise RuntimeError(
            f"the schedule's mesh is pipeline={pipeline} x sequence={sequence} x data={data} "
            f"= {expected} ranks, but the job was launched with {world_size}; "
            f"launch with --nproc-per-node {expected}"
        )
    device_mesh = init_device_mesh(device.type, (pipeline, sequence, data), mesh_dim_names=MESH_DIMENSIONS)
    stage, sequence_index, data_index = device_mesh.get_coordinate()
    grid = device_mesh.mesh
    previous_rank = int(grid[stage - 1, sequence_index, data_index]) if stage > 0 else None
    next_rank = int(grid[stage + 1, sequence_index, data_index]) if stage < pipeline - 1 else None
    return RuntimeMesh(
        device_mesh=device_mesh,
        device=device,
        rank=dist.get_rank(),
        world_size=world_size,
        stage=stage,
        sequence_index=sequence_index,
        data_index=data_index,
        n_stages=pipeline,
        pipeline_group=device_mesh.get_group("pipeline"),
        sequence_group=device_mesh.get_group("sequence"),
        data_group=device_mesh.get_group("data"),
        previous_stage_rank=previous_rank,
        next_stage_rank=next_rank,
    )


def tied_embedding_group(mesh: RuntimeMesh) -> dist.ProcessGroup | None:
    """The pair of ranks holding the two copies of a tied embedding for this rank's (sequence, data)
    coordinate: the first and the last stage ([Note: tied embeddings across stages] in
    schedlang.runtime.model). None on a one-stage mesh and on a rank of a middle stage.

    Every rank must call it, in the same order relative to the other groups it creates: it builds the pair of
    every coordinate.
    """
    if mesh.n_stages == 1:
        return None
    grid = mesh.device_mesh.mesh
    own = None
    for sequence_index in range(grid.shape[1]):
        for data_index in range(grid.shape[2]):
            pair = [int(grid[0, sequence_index, data_index]), int(grid[-1, sequence_index, data_index])]
            group = dist.new_group(pair)
            if mesh.rank in pair:
                own = group
    return own
