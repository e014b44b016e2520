"""benchmarks/profile_stage.py on the CPU: any schedule's model (here a small mamba2 + attention stack on one
stage, first and last at once), its operator and family tables for each chunk count, and a stage the file lacks
refused by name."""

import pytest

from benchmarks.profile_stage import main

SCHEDULE = """schedule small_mamba2
model {
  vocab    = 128
  d_model  = 64
  layers   = [mamba2, attn]
  heads    = 4
  head_dim = 32
  state_size = 16
  mlp      = swiglu(ratio = 2.0)
}
mesh { pipeline = 1 }
sequence {
  length = 64
  chunks = 1
}
pipeline {
  microbatches = 1
  order        = 1f1b
}
train { dtype = fp32 }
"""


def test_a_one_stage_mamba2_model_is_profiled_at_each_chunk_count(tmp_path, capsys):
    schedule = tmp_path / "small.sched"
    schedule.write_text(SCHEDULE)
    assert main(["--schedule", str(schedule), "--device", "cpu", "--length", "64", "--chunks", "1", "2",
                 "--top", "40"]) == 0
    out = capsys.readouterr().out
    assert "64 tokens in 1 chunk(s)" in out and "64 tokens in 2 chunk(s)" in out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert any(row.startswith("| kernel family |") for row in rows)
    assert any("Ssd" in row for row in rows), "the mamba2 layer's operator is not in the table"
    assert any("CrossEntropy" in row for row in rows), "the one stage is also the last: it has the loss"
    total = next(row for row in rows if row.startswith("| total |"))
    one, two = (float(cell) for cell in total.split("|")[2:4])
    assert one > 0 and two > 0


def test_a_stage_the_schedule_lacks_is_refused(tmp_path, capsys):
    schedule = tmp_path / "small.sched"
    schedule.write_text(SCHEDULE)
    with pytest.raises(SystemExit):
        main(["--schedule", str(schedule), "--device", "cpu", "--length", "64", "--stage", "1"])
    assert "has 1 stage(s), 0 to 0" in capsys.readouterr().err
