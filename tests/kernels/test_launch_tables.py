"""kernels/common/launch_tables.py: reads see the registered values, or the overrides of the enclosing blocks;
an override naming what no table has is refused; no registered value ever changes."""

import pytest

from schedlang.kernels.common import launch_tables
from schedlang.kernels.common.launch_tables import (
    LaunchTable,
    current_launch_tables,
    launch_overrides,
    register_launch_table,
    table_source,
)


@pytest.fixture()
def table(monkeypatch):
    monkeypatch.setattr(launch_tables, "LAUNCH_TABLES", {})
    return register_launch_table(
        "op", __name__, {"forward": dict(block_k=64, num_warps=4), "backward": dict(block_v=32, precision="ieee")}
    )


def test_reads_see_the_overrides_of_the_enclosing_blocks_and_then_the_registered_values(table):
    assert dict(table["forward"]) == {"block_k": 64, "num_warps": 4}
    with launch_overrides({"op": {"forward": {"block_k": 16}}}):
        assert dict(table["forward"]) == {"block_k": 16, "num_warps": 4}
        assert dict(table["backward"]) == {"block_v": 32, "precision": "ieee"}
        with launch_overrides({"op": {"forward": {"num_warps": 8}, "backward": {"precision": "tf32x3"}}}):
            assert dict(table["forward"]) == {"block_k": 16, "num_warps": 8}
            assert table["backward"]["precision"] == "tf32x3"
        assert dict(table["forward"]) == {"block_k": 16, "num_warps": 4}
    assert dict(table["forward"]) == {"block_k": 64, "num_warps": 4}
    assert dict(table.registered["forward"]) == {"block_k": 64, "num_warps": 4}


def test_an_exception_leaves_the_registered_values(table):
    with pytest.raises(RuntimeError):
        with launch_overrides({"op": {"forward": {"block_k": 16}}}):
            raise RuntimeError("a launch failed")
    assert table["forward"]["block_k"] == 64


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"other": {"forward": {"block_k": 16}}}, "no launch table 'other'"),
        ({"op": {"middle": {"block_k": 16}}}, "has no entry 'middle'"),
        ({"op": {"forward": {"block_v": 16}}}, "has no knob 'block_v'"),
    ],
)
def test_an_override_of_nothing_is_refused(table, overrides, message):
    with pytest.raises(ValueError, match=message):
        with launch_overrides(overrides):
            pass
    assert table["forward"]["block_k"] == 64


def test_the_tables_print_as_json_and_as_source(table):
    with launch_overrides({"op": {"forward": {"block_k": 16}}}):
        assert current_launch_tables() == {
            "op": {"forward": {"block_k": 16, "num_warps": 4}, "backward": {"block_v": 32, "precision": "ieee"}}
        }
        source = table_source(table)
    assert '"forward": dict(block_k=16, num_warps=4),' in source
    assert '"backward": dict(block_v=32, precision="ieee"),' in source


def test_the_kernel_modules_register_their_tables():
    from schedlang.kernels.common import triton_scan
    from schedlang.kernels.gla import chunk_triton

    assert isinstance(chunk_triton.LAUNCH, LaunchTable) and launch_tables.LAUNCH_TABLES["gla"] is chunk_triton.LAUNCH
    assert launch_tables.LAUNCH_TABLES["scan"] is triton_scan.SCAN_LAUNCH
    with launch_overrides({"scan": {"scan": {"prefetch": 0}}}):
        assert triton_scan.SCAN_LAUNCH["scan"]["prefetch"] == 0
    assert triton_scan.SCAN_LAUNCH["scan"]["prefetch"] == 1
