"""Bounds on what a command does for its arguments: finite hardware numbers, --fit's search, --timeout, drawings,
and the legality report of a badly misordered explicit order."""

from __future__ import annotations

import pytest

from reliability_helpers import TWO_RANK_SCHEDULE, run_cli


@pytest.fixture
def schedule(tmp_path):
    path = tmp_path / "two.sched"
    path.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    return path


@pytest.mark.parametrize("flag", ["--latency", "--kernel-gap", "--throughput", "--bandwidth", "--memory-bandwidth"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_hardware_options_are_refused(schedule, flag, value):
    completed = run_cli("simulate", schedule, "--cost-model", "flops", flag, value, timeout=60)
    assert completed.returncode == 1
    assert f"{flag} must be a finite number, got {value}" in completed.stderr


@pytest.mark.parametrize(
    "arguments, said",
    [
        (("--max-length", "99999999999999999999"), "--max-length must be in 1 .. 2147483648"),
        (("--max-chunks", "100000000"), "--max-chunks must be in 1 .. 4096"),
        (("--max-length", "2147483648", "--step", "1"), "gives 2147483648 lengths, more than 65536"),
    ],
    ids=["max-length", "max-chunks", "lengths"],
)
def test_fit_bounds_its_arguments_before_searching(schedule, arguments, said):
    completed = run_cli("simulate", schedule, "--fit", *arguments, timeout=60)
    assert completed.returncode == 1
    assert said in completed.stderr


def test_a_timeout_too_short_to_rendezvous_is_refused(schedule):
    completed = run_cli("run", schedule, "--device", "cpu", "--timeout", "1e-9", timeout=60)
    assert completed.returncode == 1
    assert "--timeout 1e-09 is too short for the ranks to meet" in completed.stderr
    assert "training" not in completed.stdout


@pytest.mark.parametrize("output_format, most", [("png", 8192), ("dot", 65536), ("chrome", 65536)])
def test_viz_refuses_to_draw_above_its_documented_size(tmp_path, output_format, most):
    schedule = tmp_path / "wide.sched"
    schedule.write_text(
        TWO_RANK_SCHEDULE.replace("microbatches = 2", "microbatches = 8192")
        .replace("chunks = 2  kernel_chunk = 16", "chunks = 4  kernel_chunk = 8"),
        encoding="utf-8",
    )
    output = tmp_path / f"out.{output_format}"
    completed = run_cli("viz", schedule, "--format", output_format, "-o", output, timeout=120)
    assert completed.returncode == 1
    assert f"viz --format {output_format} draws at most {most} tasks, and this schedule has 131072" in completed.stderr
    assert "pipeline { microbatches = 8192" in completed.stderr  # the caret is at the largest factor
    assert not output.exists()


def _misordered(microbatches: int) -> str:
    """Two stages whose explicit lines run every backward before its forward."""
    tasks = [f"F{m}.{c}" for m in range(microbatches) for c in (0, 1)]
    tasks += [f"B{m}.{c}" for m in range(microbatches) for c in (1, 0)]
    line = " ".join(reversed(tasks))
    return TWO_RANK_SCHEDULE.replace(
        "microbatches = 2  order = 1f1b", f"microbatches = {microbatches}  order = explicit\n"
        f"  stage 0: {line}\n  stage 1: {line}\n"
    )


def test_order_violations_are_capped_like_every_diagnostic_list(tmp_path):
    schedule = tmp_path / "misordered.sched"
    schedule.write_text(_misordered(1500), encoding="utf-8")
    assert len(schedule.read_bytes()) > 60_000
    completed = run_cli("check", schedule, timeout=240)
    assert completed.returncode == 1
    assert completed.stderr.count(": error: ") == 50
    assert "... and 11950 more diagnostics not shown" in completed.stderr
    assert completed.stderr.rstrip().endswith("illegal: 12000 violations (2 stages, 1500 microbatches, 2 chunks, "
                                              "12000 tasks)")
    assert len(completed.stderr) < 100_000


@pytest.mark.parametrize(
    "arguments, said",
    [
        (("--chunks", "2", "0"), "--chunks must be positive, got 0\n"),
        (("--extra-warmup", "1", "-1"), "--extra-warmup must be at least 0, got -1\n"),
    ],
    ids=["chunks", "extra-warmup"],
)
def test_simulate_names_the_bad_value_of_a_list_flag(schedule, arguments, said):
    completed = run_cli("simulate", schedule, *arguments, timeout=60)
    assert completed.returncode == 1
    assert completed.stderr.endswith(said)
