"""benchmarks/gdn_overlap.py on the CPU: its schedules are launch-table overrides the gdn table accepts and that
select what their names say, its arguments parse, it refuses to run without a GPU, and it runs as a file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gdn_overlap import main, schedules
from schedlang.kernels.common.launch_tables import LAUNCH_TABLES, launch_overrides
from schedlang.kernels.gdn import state_pass_triton  # noqa: F401  (registers the "gdn" launch table)


def test_schedules_select_one_segment_then_each_split_and_tile():
    chosen = schedules([0.25, 0.75], [32])
    assert [schedule.name for schedule in chosen] == [
        "segments=1", "segments=1 state BV=32", "segments=2 split=0.25", "segments=2 split=0.25 state BV=32",
        "segments=2 split=0.75", "segments=2 split=0.75 state BV=32",
    ]
    table = LAUNCH_TABLES["gdn"]
    for schedule in chosen:
        with launch_overrides(schedule.overrides):
            overlap, forward, backward = table["overlap"], table["forward"], table["backward"]
        assert schedule.name.startswith(f"segments={overlap['segments']}")
        assert (f"split={overlap['split']:.2f}" in schedule.name) == (overlap["segments"] == 2)
        registered = table["forward"]["block_v"]
        assert forward["block_v"] == backward["block_v"] == (32 if "BV=32" in schedule.name else registered)


def test_splits_outside_the_open_interval_are_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--splits", "0.5", "1.0"])
    assert exited.value.code == 2
    assert "--splits must lie strictly between 0 and 1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--no-peer", "--regions", "--lengths", "4096", "--splits", "0.5", "--state-block-v", "32"])
    assert exited.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_it_runs_as_a_file(tmp_path):
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gdn_overlap.py"
    completed = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "--regions" in completed.stdout
