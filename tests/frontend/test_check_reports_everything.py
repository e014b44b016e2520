"""``schedlang check`` reports every problem of a file in one run: the legality pass and the data preflight
run on the parts of the file its erroneous keys do not feed, and the deadlock and the missing data file
carry a hint."""

from __future__ import annotations

import pytest

from schedlang.cli import main

EVERY_MISTAKE = """schedule every_mistake

model {{
  vocab    = 256
  d_model  = 128
  layers   = [gla] * 2
  heads    = 2
  head_dim = 64
  colour   = 3
}}

mesh {{
  pipeline = 2
}}

sequence {{
  length       = 1024
  chunks       = [0, {boundary}, 1024]
  kernel_chunk = 64
}}

pipeline {{
  microbatches = 2
  order = explicit
  stage 0: F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0
  stage 1: {stage_1}
}}

train {{
  steps     = 10
  dtype     = {dtype}
  optimizer = adamw(lr = 3e-3)
  data      = tokens(path = "missing.bin")
}}
"""

DEADLOCKING = "F1.0 F1.1 B1.1 B1.0 F0.0 F0.1 B0.1 B0.0"
LEGAL = "F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0"


def _check(tmp_path, capsys, **changes) -> str:
    values = dict(boundary=500, stage_1=DEADLOCKING, dtype="float17") | changes
    schedule = tmp_path / "every.sched"
    schedule.write_text(EVERY_MISTAKE.format(**values), encoding="utf-8")
    assert main(["check", str(schedule)]) == 1
    return capsys.readouterr().err


def test_one_run_reports_the_key_errors_the_deadlock_and_the_missing_file(tmp_path, capsys):
    err = _check(tmp_path, capsys)
    reported = [
        "every.sched:9:3: error: unknown key 'colour'",
        "every.sched:18:22: error: chunk boundary 500 is not a multiple of 64",
        "every.sched:31:15: error: unknown dtype 'float17'",
        "every.sched:25:22: error: deadlock: stages 0, 1 wait for each other",
        f"every.sched:33:22: error: data file {tmp_path / 'missing.bin'} does not exist",
    ]
    for line in reported:
        assert line in err
    assert "Traceback" not in err


def test_the_deadlock_and_the_missing_file_each_carry_a_hint(tmp_path, capsys):
    err = _check(tmp_path, capsys, boundary=512, dtype="fp32")
    assert "  hint: stage 1 must run 1B0.1 (step 6) before its stuck 1F1.0 (step 0)" in err
    assert f"  hint: a relative path is read from the schedule file's directory ({tmp_path})" in err


@pytest.mark.parametrize("stage_1", [LEGAL, DEADLOCKING])
def test_a_legal_order_beside_key_errors_adds_no_legality_report(tmp_path, capsys, stage_1):
    err = _check(tmp_path, capsys, stage_1=stage_1)
    assert ("deadlock" in err) == (stage_1 == DEADLOCKING)
    assert "data file" in err


def test_an_error_in_the_pipeline_block_skips_legality_but_still_checks_the_data(tmp_path, capsys):
    err = _check(tmp_path, capsys, stage_1="F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B9.0")
    assert "deadlock" not in err and "never runs" not in err
    assert "missing.bin does not exist" in err
