"""Spawn a gloo process group on 127.0.0.1 (file store) and run one worker function on every rank."""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world_size: int, init_file: str, worker, worker_args: tuple) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        worker(rank, world_size, *worker_args)
        # every rank done before any tears gloo down: a rank destroying its group while a peer's last collective
        # is still in flight aborted the peer ("terminate called without an active exception") in two full-tier runs
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # The worker passed on every rank (the barrier): leave without the interpreter's shutdown, where gloo's
    # threads can abort a rank (docs/log.md, the gloo teardown abort). A worker that raised never gets here:
    # its traceback reaches the parent through spawn.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_on_ranks(world_size: int, worker, *worker_args) -> None:
    """Run ``worker(rank, world_size, *worker_args)`` in ``world_size`` processes.

    An exception on any rank fails the call with that rank's traceback.
    """
    with tempfile.TemporaryDirectory() as directory:
        init_file = os.path.join(directory, "store")
        mp.spawn(_entry, args=(world_size, init_file, worker, worker_args), nprocs=world_size, join=True)


def chunk_slices(chunk_start: int, chunk_end: int, world_size: int) -> tuple[tuple[int, int], ...]:
    """Every rank's contiguous share ``(start, end)`` of the chunk ``chunk_start .. chunk_end``, rank by rank: the
    split ``PipelineConfig.local_bounds`` (schedlang.runtime.config) makes."""
    size = chunk_end - chunk_start
    return tuple(
        (chunk_start + size * index // world_size, chunk_start + size * (index + 1) // world_size)
        for index in range(world_size)
    )
