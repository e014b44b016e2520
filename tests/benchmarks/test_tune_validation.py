"""benchmarks/tune_validation.py: its table and verdict, and the whole path on the CPU with the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.tune_validation import summary, table

REPOSITORY = Path(__file__).resolve().parents[2]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tune_validation.py"


def row(rank: int, predicted: float, measured: float | None, tokens: int = 1000) -> dict:
    outcome = {"outcome": "timed out"} if measured is None else {
        "outcome": "measured", "step_seconds": measured, "tokens_per_second": tokens / measured,
        "peak_memory_gib": 1.0,
    }
    return {
        "rank": rank, "changes": {"sequence.chunks": str(2**rank)}, "predicted_step_seconds": predicted,
        "predicted_tokens_per_second": tokens / predicted, "measured": outcome,
    }


def test_summary_compares_the_pick_with_the_best_measured():
    rows = [row(1, 1.0, 1.04), row(2, 1.1, 1.0), row(3, 1.2, None)]
    assert summary(rows) == (
        "the pick ran 0.962 of the best measured tokens/s (within 5%); largest step-time error 9.1% over 2 measured "
        "candidates"
    )
    assert "outside 5%" in summary([row(1, 1.0, 1.2), row(2, 1.1, 1.0)])
    assert summary([row(1, 1.0, None)]) == "no candidate trained"


def test_table_has_a_row_per_candidate_and_the_ratio():
    lines = table([row(1, 1.0, 1.04), row(2, 1.1, None)]).splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| 1 | `sequence.chunks = 2` | - | 1 | 1.04 | 1.040 | 1,000 | 962 |")
    assert "| `sequence.chunks = 2` | 40% | 1 |" in table([{**row(1, 1.0, 1.04), "host_bound_share": 0.4}])
    assert "| timed out |" in lines[3]


def test_the_whole_path_runs_on_the_cpu_with_the_tiny_model(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--length", "256", "--candidates", "2",
         "--warmup", "0", "--steps", "1", "--out", str(tmp_path / "out"), "--", "--max-chunks", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["length"] == 256 and len(results["rows"]) == 2
    for result in results["rows"]:
        assert result["measured"]["outcome"] == "measured", result["measured"]
        assert result["measured"]["step_seconds"] > 0 and result["predicted_step_seconds"] > 0
        assert Path(result["file"]).exists()
    lines = completed.stdout.splitlines()
    assert lines[1].startswith("| rank | changes from the file | host-bound | predicted step s | measured step s")
    assert lines[-1].startswith("the pick ran")


def test_spread_takes_the_pick_the_file_as_written_and_evenly_spaced_kinds():
    from benchmarks.tune_validation import spread

    def candidate(rank, **changes):
        return {"rank": rank, "changes": {key.replace("_", ".", 1): value for key, value in changes.items()}}

    ranking = [candidate(1, sequence_chunks="2"), candidate(2, sequence_chunks="2", pipeline_split_backward="true")]
    ranking += [candidate(3 + index, sequence_chunks=str(4 << index)) for index in range(8)]
    ranking.insert(5, candidate(99))  # the file as written, ranked sixth
    chosen = spread(ranking, 4)
    assert [c["rank"] for c in chosen][:1] == [1] and len(chosen) == 4
    assert any(not c["changes"] for c in chosen)  # the file as written
    assert all(c["rank"] != 2 for c in chosen)  # a one-stage no-op variant of the pick is the same kind
    assert chosen[-1]["rank"] == 10  # the last kind of the ranking closes the spread
    assert [ranking.index(c) for c in chosen] == sorted(ranking.index(c) for c in chosen)
    assert spread(ranking[:3], 7) == [ranking[0], ranking[2]]


def test_a_candidates_time_limit_grows_with_its_predicted_steps():
    """A 17 s step at 1M tokens gets its start-up allowance plus twice its two steps; a short one little more."""
    import argparse

    from benchmarks.tune_validation import run_time_limit

    args = argparse.Namespace(timeout=60.0, first_timeout=240.0, warmup=1, steps=1)
    assert run_time_limit(16.8, 1, args) == pytest.approx(60 + 2 * 2 * 16.8)
    assert run_time_limit(0.8, 1, args) == pytest.approx(63.2)
    assert run_time_limit(16.8, 2, args) == pytest.approx(60 + 2 * 3 * 16.8)  # step graphs' capture step


def test_the_first_run_which_compiles_the_kernels_gets_its_own_allowance():
    import argparse

    from benchmarks.tune_validation import run_time_limit

    args = argparse.Namespace(timeout=40.0, first_timeout=240.0, warmup=2, steps=2)
    assert run_time_limit(0.79, 2, args, first=True) == pytest.approx(240 + 2 * 4 * 0.79)
    assert run_time_limit(0.79, 2, args) == pytest.approx(40 + 2 * 4 * 0.79)


def test_a_step_graphs_candidate_warms_up_through_its_capture_step():
    """Under step graphs the second step captures the walk (and then replays it): a measurement asking one
    warm-up step would time that capture (256K, 2026-12-06: 1.22-1.66x the replayed step), so it warms up two."""
    import argparse

    from benchmarks.tune_validation import warmup_steps

    eager = (REPOSITORY / "benchmarks/schedules/gla_1b_one_device.sched").read_text(encoding="utf-8")
    graphs = eager.replace("cuda_graphs    = false", "cuda_graphs    = step", 1)
    assert graphs != eager
    for asked, eager_warmup, graphs_warmup in ((1, 1, 2), (2, 2, 2), (3, 3, 3)):
        args = argparse.Namespace(warmup=asked)
        assert (warmup_steps(eager, args), warmup_steps(graphs, args)) == (eager_warmup, graphs_warmup)


def test_calibrate_measures_the_factors_on_this_machine_and_tunes_with_them(tmp_path):
    """``--calibrate PROFILE``: a CPU profile of the tiny model, calibrated again by the script on its
    ``--calibration-schedule`` before tune; tune names the calibrated profile and the candidates train."""
    import argparse

    from benchmarks.tune_validation import base_schedule

    tiny = tmp_path / "tiny.sched"
    tiny.write_text(base_schedule(argparse.Namespace(schedule=None, device="cpu", tiny=True, length=256)))
    profiled = subprocess.run(
        [sys.executable, "-m", "schedlang", "profile", str(tiny), "--device", "cpu", "--name", "cpu-tiny",
         "-o", str(tmp_path / "cpu.toml")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--length", "256", "--candidates", "1",
         "--warmup", "0", "--steps", "1", "--out", str(tmp_path / "out"), "--calibrate", str(tmp_path / "cpu.toml"),
         "--calibration-schedule", str(tiny), "--", "--max-chunks", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    calibrated = (tmp_path / "out" / "calibrated.toml").read_text()
    assert "[calibration]" in calibrated and 'schedule = "tiny.sched"' in calibrated
    assert "# calibration: `schedlang run tiny.sched` measured" in completed.stdout
    assert "out/calibrated.toml" in completed.stdout
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [row["measured"]["outcome"] for row in results["rows"]] == ["measured"]


def test_ranks_choose_the_candidates_to_train_and_a_rank_tune_never_gave_is_refused():
    import argparse

    from benchmarks.tune_validation import chosen_candidates

    ranking = [{"rank": rank, "changes": {"sequence.chunks": rank}} for rank in range(1, 11)]
    assert [c["rank"] for c in chosen_candidates(ranking, argparse.Namespace(ranks=[9, 3, 3], candidates=7))] == [3, 9]
    with pytest.raises(SystemExit, match="no rank 12"):
        chosen_candidates(ranking, argparse.Namespace(ranks=[3, 12], candidates=7))


def test_changes_name_candidates_whatever_their_rank_and_an_unknown_set_is_refused():
    """A profile that prices the host anew moves candidates up and down tune's ranking; --changes finds the same
    schedules by what they change."""
    import argparse

    from benchmarks.tune_validation import chosen_candidates

    ranking = [
        {"rank": 1, "changes": {"sequence.chunks": "2"}},
        {"rank": 2, "changes": {"sequence.chunks": "32", "pipeline.recompute": "mlp", "pipeline.offload": "true"}},
        {"rank": 3, "changes": {"sequence.chunks": "32", "pipeline.recompute": "mlp"}},
    ]
    names = ["pipeline.recompute=mlp/sequence.chunks=32", "sequence.chunks = 2", "sequence.chunks=2"]
    chosen = chosen_candidates(ranking, argparse.Namespace(ranks=None, changes=names, candidates=7))
    assert [candidate["rank"] for candidate in chosen] == [3, 1]
    with pytest.raises(SystemExit, match="no candidate of tune's 3 has exactly these changes"):
        chosen_candidates(ranking, argparse.Namespace(ranks=None, changes=["sequence.chunks=32"], candidates=7))
    with pytest.raises(SystemExit, match="each change is block.key=value"):
        chosen_candidates(ranking, argparse.Namespace(ranks=None, changes=["sequence.chunks"], candidates=7))


def test_a_run_stopped_at_its_limit_keeps_the_steps_it_finished(monkeypatch, tmp_path):
    import argparse

    from benchmarks import tune_validation
    from schedlang import profile_calibration

    finished = [{"step_seconds": s, "tokens_per_second": 100 / s, "peak_memory_bytes": 2**30} for s in (9.0, 2.0, 3.0)]

    def stopped_after(count):
        def train(path, device, steps, timeout):
            raise profile_calibration.RunTimedOut("over", finished[:count])
        return train

    args = argparse.Namespace(device="cpu", steps=2, timeout=1.0)
    monkeypatch.setattr(profile_calibration, "train_and_read_steps", stopped_after(3))
    measured = tune_validation.measure(tmp_path / "c.sched", 1, args)
    assert measured["outcome"] == "measured" and measured["steps"] == "3 of 3"
    assert measured["step_seconds"] == 2.5  # the warm-up step left out
    monkeypatch.setattr(profile_calibration, "train_and_read_steps", stopped_after(2))
    assert tune_validation.measure(tmp_path / "c.sched", 1, args)["step_seconds"] == 2.0
    monkeypatch.setattr(profile_calibration, "train_and_read_steps", stopped_after(1))
    assert tune_validation.measure(tmp_path / "c.sched", 1, args) == {"outcome": "timed out after 1 of 3 steps (9 s)"}
    monkeypatch.setattr(profile_calibration, "train_and_read_steps", stopped_after(0))
    assert tune_validation.measure(tmp_path / "c.sched", 1, args) == {"outcome": "timed out after 0 of 3 steps"}


def test_a_killed_runs_metrics_are_read_up_to_the_cut(tmp_path):
    from schedlang.profile_calibration import read_steps

    metrics = tmp_path / "steps.jsonl"
    assert read_steps(metrics) == []
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert read_steps(metrics) == [{"step": 1}, {"step": 2}]


def test_an_offloading_runs_pinned_host_memory_is_kept_beside_its_time(monkeypatch, tmp_path):
    import argparse

    from benchmarks import tune_validation
    from schedlang import profile_calibration

    steps = [{"step_seconds": 2.0, "tokens_per_second": 50.0, "peak_memory_bytes": 2**30, "pinned_host_bytes": pinned}
             for pinned in (3 * 2**30, 5 * 2**30, 4 * 2**30)]
    monkeypatch.setattr(profile_calibration, "train_and_read_steps", lambda path, device, count, timeout: steps)
    args = argparse.Namespace(device="cpu", steps=2, timeout=1.0)
    assert tune_validation.measure(tmp_path / "c.sched", 1, args)["pinned_host_gib"] == 5.0
    for step in steps:
        del step["pinned_host_bytes"]
    assert "pinned_host_gib" not in tune_validation.measure(tmp_path / "c.sched", 1, args)


def test_twins_pair_each_candidate_that_changes_the_key_with_the_same_schedule_without_it():
    import argparse

    from benchmarks.tune_validation import chosen_candidates

    def candidate(rank, seconds, pinned=0.0, **changes):
        return {"rank": rank, "step_seconds": seconds, "reserved_gib": [50.0], "pinned_host_gib": [pinned],
                "changes": {k.replace("_", "."): v for k, v in changes.items()}}

    ranking = [
        candidate(1, 1.0, sequence_chunks="2"),
        candidate(2, 1.01, sequence_chunks="4"),
        candidate(3, 1.02, pipeline_offload="true"),  # one chunk: offload copies nothing, changes nothing
        candidate(4, 1.0201),
        candidate(5, 1.0, 20.0, sequence_chunks="2", pipeline_offload="true"),  # copies hidden: the pinned differs
        candidate(6, 1.2, 30.0, sequence_chunks="4", pipeline_offload="true"),
        candidate(7, 1.3, 40.0, sequence_chunks="8", pipeline_offload="true"),  # no twin in the ranking
    ]
    args = argparse.Namespace(ranks=None, twins="pipeline.offload", candidates=3)
    assert [c["rank"] for c in chosen_candidates(ranking, args)] == [1, 5, 6, 2]
    args.candidates = 2
    assert [c["rank"] for c in chosen_candidates(ranking, args)] == [1, 5]  # its twin is the pick, trained once
    args.candidates = 1
    assert [c["rank"] for c in chosen_candidates(ranking, args)] == [1]


def test_summary_holds_each_offloading_rows_pinned_host_beside_the_model():
    rows = [row(1, 1.0, 1.0), row(2, 1.1, 1.1)]
    rows[1]["predicted_pinned_host_gib"] = 24.7
    rows[1]["measured"]["pinned_host_gib"] = 32.0
    assert summary(rows).endswith("; pinned host, predicted / the allocator's peak: rank 2 24.7 / 32.0 GiB")
    assert "pinned" not in summary(rows[:1])
