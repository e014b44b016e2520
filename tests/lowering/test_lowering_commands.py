"""``schedlang check`` and ``schedlang simulate`` on schedule files, through the front end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from schedlang.commands import check, simulate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

EXPLICIT = """\
schedule tiny

model {
  vocab    = 256
  d_model  = 128
  layers   = [gla] * 2
  heads    = 2
  head_dim = 64
}

mesh {
  pipeline = 2
}

sequence {
  length       = 1024
  chunks       = 2
  kernel_chunk = 64
}

pipeline {
  microbatches = 2
  order = explicit
  stage 0: STAGE0
  stage 1: STAGE1
}
"""


def run_command(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def write_schedule(tmp_path, stage0, stage1):
    path = tmp_path / "tiny.sched"
    path.write_text(EXPLICIT.replace("STAGE0", stage0).replace("STAGE1", stage1))
    return str(path)


def test_check_legal_file_prints_one_line_summary(capsys):
    path = str(EXAMPLES / "gla_stateflow.sched")
    assert run_command(check, [path]) == 0
    assert capsys.readouterr().out == f"{path}: legal: 2 stages, 4 microbatches, 4 chunks, 64 tasks\n"


def test_check_reports_every_violation_at_its_token(tmp_path, capsys):
    path = write_schedule(tmp_path, "F0.0 F0.1 F1.0 F1.1 B0.0 B0.1 B1.1 B1.1", "F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0")
    assert run_command(check, [path]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:24:47: error: stage 0 runs B1.1 twice (first at step 6); remove one",
        "  stage 0: F0.0 F0.1 F1.0 F1.1 B0.0 B0.1 B1.1 B1.1",
        "                                              ^~~~",
        f"{path}:24:3: error: stage 0 never runs B1.0 (the backward of microbatch 1, chunk 0)",
        "  stage 0: F0.0 F0.1 F1.0 F1.1 B0.0 B0.1 B1.1 B1.1",
        "  ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~",
        f"{path}:24:32: error: stage 0 runs B0.0 (step 4) before B0.1 (step 5), but Eq. 8 requires "
        "B[r,a,i+1] before B[r,a,i]: a chunk's backward consumes the state gradient from the next chunk's "
        "backward; move B0.0 after B0.1",
        "  stage 0: F0.0 F0.1 F1.0 F1.1 B0.0 B0.1 B1.1 B1.1",
        "                               ^~~~",
        "illegal: 3 violations (2 stages, 2 microbatches, 2 chunks, 16 tasks)",
    ]


def test_check_deadlock_points_at_the_first_stuck_task(tmp_path, capsys):
    path = write_schedule(tmp_path, "F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0", "F0.0 F0.1 F1.0 F1.1 B0.1 B0.0 B1.1 B1.0")
    assert run_command(check, [path]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        f"{path}:24:22: error: deadlock: stages 0, 1 wait for each other in a cycle, "
        "so none of them can run its next task"
    )
    assert lines[2] == "                     ^~~~"
    assert "  2     0B0.1 <-- stuck  1F1.0 <-- stuck" in lines


def test_simulate_json_has_the_documented_fields(capsys):
    assert run_command(simulate, [str(EXAMPLES / "gla_stateflow.sched"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # 2 stages, 4 microbatches, 4 chunks, 1f1b: Eq. 15 and Eq. 13 exactly
    assert result["makespan"] == pytest.approx((4 * 4 + 2 - 1) * 3 / 4)
    assert result["peak_activations"] == [1.25, 1.0]
    assert result["bubble_fraction"] == pytest.approx(1 - 24 / (2 * 12.75))
    assert result["busy_time"] == [12.0, 12.0]
    assert result["n_tasks"] == 64 and result["cost_model"] == "unit"


def test_simulate_flops_table_and_illegal_schedule(tmp_path, capsys):
    assert run_command(simulate, [str(EXAMPLES / "gla_stateflow.sched"), "--cost-model", "flops"]) == 0
    out = capsys.readouterr().out
    assert "cost model flops (time in seconds)" in out and "peak activations" in out
    path = write_schedule(tmp_path, "F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0", "F0.0 F0.1 F1.0 F1.1 B0.1 B0.0 B1.1 B1.0")
    assert run_command(simulate, [path]) == 1
    assert "deadlock" in capsys.readouterr().err


def test_dispatcher_runs_check_and_simulate(capsys):
    from schedlang.cli import main

    path = str(EXAMPLES / "explicit_order.sched")
    assert main(["check", path]) == 0
    assert capsys.readouterr().out == f"{path}: legal: 2 stages, 2 microbatches, 2 chunks, 16 tasks\n"
    assert main(["simulate", path, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # the explicit order: stage 0 runs all four forwards first, stage 1 finishes microbatch 0 first
    assert result["order"] == "explicit" and result["peak_activations"] == [2.0, 1.0]


def test_simulate_sweeps_chunk_counts_of_the_schedules_own_partition(capsys):
    path = str(EXAMPLES / "gla_stateflow.sched")  # 2 stages, 4 microbatches, 4 uniform chunks, 1f1b
    assert run_command(simulate, [path, "--chunks", "1", "4", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sweep"]
    assert [row["n_chunks"] for row in rows] == [1, 4, 8]
    for row in rows:  # the unit model reproduces Eq. 15 and Eq. 13 at every count
        n = row["n_chunks"]
        assert row["makespan"] == pytest.approx((4 * n + 2 - 1) * 3 / n)
        assert row["peak_activations"][0] == pytest.approx(min(4 * n, n + 1) / n)
    assert run_command(simulate, [path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == rows[1]["makespan"]
    assert run_command(simulate, [path, "--chunks", "1", "8"]) == 0
    assert "swept" in capsys.readouterr().out


def test_simulate_sweeps_extra_warmup_with_chunk_counts(capsys):
    path = str(EXAMPLES / "gla_stateflow.sched")  # 2 stages, 4 microbatches, 4 uniform chunks, 1f1b
    assert run_command(simulate, [path, "--chunks", "2", "8", "--extra-warmup", "0", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sweep"]
    assert [(row["n_chunks"], row["extra_warmup"]) for row in rows] == [(2, 0), (2, 3), (8, 0), (8, 3)]
    for row in rows:  # stage 0 holds e chunks more (Eq. 13 with the extra warm-up), stage 1 as many as before
        n, extra = row["n_chunks"], row["extra_warmup"]
        assert row["peak_activations"] == pytest.approx([min(4 * n, n + 1 + extra) / n, 1.0])
        assert row["eq13_peak_activations"] == pytest.approx(row["peak_activations"])
    assert run_command(simulate, [path, "--extra-warmup", "1"]) == 0
    out = capsys.readouterr().out
    # the title, the column names, one row and the line naming the peak activations' unit
    assert "extra warm-up" in out and len(out.strip().splitlines()) == 4 and "shortest" not in out
    assert run_command(simulate, [path, "--extra-warmup", "0", "2", "--cost-model", "flops"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    makespans = [float(row.split()[3]) for row in rows]
    marked = [row.endswith("<- shortest") for row in rows]
    assert marked == [makespan == min(makespans) for makespan in makespans] and sum(marked) == 1
    gpipe = str(EXAMPLES / "simple_gla_gpipe.sched")
    assert run_command(simulate, [gpipe, "--extra-warmup", "1"]) == 1
    assert "--extra-warmup applies to order = 1f1b" in capsys.readouterr().err


def test_simulate_sweep_refuses_what_fixes_the_chunk_count(capsys):
    assert run_command(simulate, [str(EXAMPLES / "explicit_order.sched"), "--chunks", "4"]) == 1
    assert "an explicit order is written for its own chunk count" in capsys.readouterr().err
    assert run_command(simulate, [str(EXAMPLES / "gla_stateflow.sched"), "--chunks", "65"]) == 1
    assert "at most 64 chunks fit" in capsys.readouterr().err


def test_simulate_split_backward_json_and_table(capsys):
    path = str(EXAMPLES / "gla_stateflow.sched")  # 2 stages, 4 microbatches, 4 uniform chunks, 1f1b
    assert run_command(simulate, [path, "--split-backward", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split_backward"] is True and result["n_tasks"] == 96
    assert result["makespan"] == 12.25 < result["eq15_makespan_unit"] == 12.75  # W fills the drain
    # stage 1 keeps stage 0's 5 chunks in flight: the W of stage 0's cool-down gradients wait to the end
    assert result["peak_activations"] == result["eq13_peak_activations"] == [1.25, 1.25]
    assert result["busy_time"] == [12.0, 12.0]
    assert run_command(simulate, [path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["split_backward"] is False
    assert run_command(simulate, [path, "--split-backward"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"{path}: 2 stages x 4 microbatches x 4 chunks, order 1f1b, split backward, cost model unit "
        "(time in full-sequence forwards)"
    )
    assert out[1] == "makespan 12.25   bubble fraction 0.0204"


def test_simulate_split_backward_sweeps_with_chunks_and_extra_warmup(capsys):
    path = str(EXAMPLES / "gla_stateflow.sched")
    arguments = [path, "--split-backward", "--chunks", "1", "4", "--extra-warmup", "0", "1"]
    assert run_command(simulate, arguments + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sweep"]
    assert [(row["n_chunks"], row["extra_warmup"], row["split_backward"]) for row in rows] == [
        (1, 0, True), (1, 1, True), (4, 0, True), (4, 1, True)
    ]
    for row in rows:
        n, extra = row["n_chunks"], row["extra_warmup"]
        stage_0 = min(4 * n, n + 1 + extra) / n
        assert row["peak_activations"] == pytest.approx([stage_0, stage_0])  # stage 1 holds stage 0's count
        assert row["makespan"] < row["eq15_makespan_unit"]
    assert run_command(simulate, arguments) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].split() == [
        "chunks", "extra", "warm-up", "split", "backward", "makespan", "vs", "first", "bubble", "peak",
        "activations", "(stage", "0)",
    ]
    assert lines[-1].startswith("peak activations: in microbatch sequences")
    assert [line.split()[:4] for line in lines[2:-1]] == [
        ["1", "0", "yes", "13"], ["1", "1", "yes", "13"], ["4", "0", "yes", "12.25"], ["4", "1", "yes", "12.25"]
    ]
    assert run_command(simulate, [path, "--chunks", "4"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[2].split()[:4] == ["4", "0", "no", "12.75"]


def test_simulate_split_backward_refuses_an_explicit_order(capsys):
    assert run_command(simulate, [str(EXAMPLES / "explicit_order.sched"), "--split-backward"]) == 1
    assert "--split-backward applies to order = gpipe or 1f1b" in capsys.readouterr().err


SPLIT_STAGE0 = "F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 B0.0 W0.0 B1.1 W1.1 B1.0 W1.0"
SPLIT_STAGE1 = "F0.0 F0.1 B0.1 B0.0 F1.0 F1.1 B1.1 B1.0 W0.1 W0.0 W1.1 W1.0"


def write_split_schedule(tmp_path, stage0, stage1):
    path = tmp_path / "split.sched"
    text = EXPLICIT.replace("order = explicit", "order = explicit\n  split_backward = true")
    path.write_text(text.replace("STAGE0", stage0).replace("STAGE1", stage1))
    return str(path)


def test_check_and_simulate_an_explicit_split_schedule(tmp_path, capsys):
    path = write_split_schedule(tmp_path, SPLIT_STAGE0, SPLIT_STAGE1)
    assert run_command(check, [path]) == 0
    assert capsys.readouterr().out == f"{path}: legal: 2 stages, 2 microbatches, 2 chunks, 24 tasks\n"
    assert run_command(simulate, [path, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split_backward"] is True and result["n_tasks"] == 24
    # stage 1 defers all its W tasks: microbatch 0's chunks stay live until the end, next to microbatch 1's
    assert result["peak_activations"] == [2.0, 2.0]


def test_check_reports_weight_task_mistakes_at_their_tokens(tmp_path, capsys):
    stage1 = SPLIT_STAGE1.replace("W0.1 W0.0", "W0.0 W0.0 W0.1").replace("B1.1 B1.0", "W1.1 B1.1 B1.0")
    stage1 = stage1.replace(" W1.1 W1.0", " W1.0")
    path = write_split_schedule(tmp_path, SPLIT_STAGE0.replace(" W1.0", ""), stage1)
    assert run_command(check, [path]) == 1
    err = capsys.readouterr().err
    assert f"{path}:26:62: error: stage 1 runs W0.0 twice (first at step 9); remove one" in err
    assert f"{path}:25:3: error: stage 0 never runs W1.0 (the weight gradients of microbatch 1, chunk 0)" in err
    assert (
        f"{path}:26:42: error: stage 1 runs W1.1 (step 6) before B1.1 (step 7), but the split backward requires "
        "B[r,a,i] before W[r,a,i]" in err
    )
    assert err.strip().splitlines()[-1] == "illegal: 3 violations (2 stages, 2 microbatches, 2 chunks, 24 tasks)"


def test_simulate_sweeps_only_variants_the_checker_accepts(capsys):
    """Each swept variant is the schedule revised and checked again, as if the file had been written so."""
    path = str(EXAMPLES / "gla_stateflow.sched")
    assert run_command(simulate, [path, "--extra-warmup", "0", str(1 << 21)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:" in err and "'pipeline.extra_warmup' must be <= 1048576, found 2097152" in err
    assert f"extra_warmup = {1 << 21}" in err and "^~~~~~~" in err  # the revised line, with the caret under it
