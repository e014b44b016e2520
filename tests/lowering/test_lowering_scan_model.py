"""The alpha-beta model of the cross-rank state scan (lowering/cost.py state_scan_seconds)."""

import pytest

from schedlang.lowering.cost import Hardware, state_scan_seconds
from schedlang.vocabulary import SequenceParallelMethod as Method

HARDWARE = Hardware(latency_s=10e-6, bandwidth_bytes_per_s=50e9)
STATE = 16 * 128 * 128 * 4


@pytest.mark.parametrize("blocks", [1, 4, 16, 128])
def test_on_two_ranks_allscan_costs_what_the_ring_costs(blocks):
    ring = state_scan_seconds(Method.RING, 2, 1, STATE, HARDWARE)
    assert state_scan_seconds(Method.ALLSCAN, 2, blocks, STATE, HARDWARE) == ring == HARDWARE.transfer_time(STATE)


def test_one_rank_sends_nothing():
    assert all(state_scan_seconds(method, 1, 4, STATE, HARDWARE) == 0.0 for method in Method)


def test_allscan_blocks_pipeline_the_middle_ranks():
    """Eq. 12's shape: with many ranks, blocks bring All-Scan from the ring's (P-1) whole states towards one."""
    ranks = 64
    ring = state_scan_seconds(Method.RING, ranks, 1, STATE, HARDWARE)
    one_block = state_scan_seconds(Method.ALLSCAN, ranks, 1, STATE, HARDWARE)
    sixteen = state_scan_seconds(Method.ALLSCAN, ranks, 16, STATE, HARDWARE)
    assert one_block == pytest.approx(ring)
    assert sixteen < ring / 2
    expected = (ranks - 3 + 16) * HARDWARE.transfer_time(STATE / 16) + HARDWARE.transfer_time(STATE)
    assert sixteen == pytest.approx(expected)


def test_allgather_volume_grows_with_ranks_and_overtakes_allscan():
    small = [state_scan_seconds(Method.ALLGATHER, ranks, 1, STATE, HARDWARE) for ranks in (2, 4, 8)]
    assert small == sorted(small)
    assert state_scan_seconds(Method.ALLGATHER, 256, 1, STATE, HARDWARE) > state_scan_seconds(
        Method.ALLSCAN, 256, 16, STATE, HARDWARE
    )
