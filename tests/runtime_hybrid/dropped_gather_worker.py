"""``tests/runtime/rank_worker.py`` with the K/V all-gather of sequence-parallel attention taken out.

The negative control of the mesh matrix: without the gather a rank's queries read keys and values its
buffers never received, so the run must leave the one-process results.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import rank_worker  # noqa: E402
import torch.distributed as dist  # noqa: E402

from schedlang.runtime import kv_buffers  # noqa: E402


def _no_gather(keys, values, slices, group) -> None:
    """The other ranks' slices as a receive that never came into zeroed buffers would leave them: zeros, so the
    run is the same every time (the real buffers are uninitialised memory)."""
    own = slices[dist.get_rank(group)]
    for start, end in slices:
        if (start, end) != own:
            keys[:, :, start:end] = 0
            values[:, :, start:end] = 0


kv_buffers.gather_chunk = _no_gather

if __name__ == "__main__":
    sys.exit(rank_worker.main())
