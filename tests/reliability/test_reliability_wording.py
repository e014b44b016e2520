"""What the commands print to a newcomer: counted nouns, units, a note when a cost model is too coarse,
the script name of ``compile -o -`` and the nearest aligned length."""

from __future__ import annotations

import pytest

from reliability_helpers import TWO_RANK_SCHEDULE, one_rank_schedule
from schedlang.cli import main
from schedlang.vocabulary.wording import counted


@pytest.mark.parametrize(
    ("count", "expected"), [(0, "0 stages"), (1, "1 stage"), (2, "2 stages")]
)
def test_counted_nouns_agree_with_their_count(count, expected):
    assert counted(count, "stage") == expected


def test_counted_takes_an_irregular_plural():
    assert [counted(n, "microbatch", "microbatches") for n in (1, 3)] == ["1 microbatch", "3 microbatches"]


def test_simulate_of_one_stage_says_stage_and_names_the_peak_activation_unit(tmp_path, capsys):
    schedule = tmp_path / "one.sched"
    schedule.write_text(one_rank_schedule(), encoding="utf-8")
    assert main(["simulate", str(schedule)]) == 0
    out = capsys.readouterr().out
    assert "1 stage x 1 microbatch x 2 chunks" in out
    assert "1 stages" not in out and "1 microbatches" not in out
    assert "peak activations: in microbatch sequences" in out


def test_the_flops_model_says_when_the_model_is_too_small_for_it(tmp_path, capsys):
    schedule = tmp_path / "two.sched"
    schedule.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    assert main(["simulate", str(schedule), "--cost-model", "flops"]) == 0
    tiny = capsys.readouterr().out
    assert "too small for the flops model" in tiny
    # the same schedule on a device a million times slower has long tasks: no note
    assert main(["simulate", str(schedule), "--cost-model", "flops", "--throughput", "4e8"]) == 0
    assert "too small" not in capsys.readouterr().out
    assert main(["simulate", str(schedule)]) == 0
    assert "too small" not in capsys.readouterr().out


def test_compile_to_standard_output_names_a_script_file_in_its_launch_line(tmp_path, capsys):
    schedule = tmp_path / "two.sched"
    schedule.write_text(TWO_RANK_SCHEDULE, encoding="utf-8")
    assert main(["compile", str(schedule), "-o", "-"]) == 0
    script = capsys.readouterr().out
    assert "torchrun --nproc-per-node 2 train.py" in script
    assert "torchrun --nproc-per-node 2 -\n" not in script


@pytest.mark.parametrize(("length", "offered"), [(1000, 1024), (900, 896), (960, 1024), (100, 128)])
def test_the_length_hint_offers_the_nearest_aligned_length(tmp_path, capsys, length, offered):
    schedule = tmp_path / "sp.sched"
    schedule.write_text(
        TWO_RANK_SCHEDULE.replace("mesh { pipeline = 2 }", "mesh { pipeline = 1  sequence = 2 }")
        .replace("length = 32  chunks = 2  kernel_chunk = 16", f"length = {length}  chunks = 1  kernel_chunk = 64"),
        encoding="utf-8",
    )
    assert main(["check", str(schedule)]) == 1
    err = capsys.readouterr().err
    assert f"try {offered}\n" in err


def test_a_long_message_is_cut_after_a_whole_sentence():
    from schedlang.vocabulary.source_lines import MAX_SHOWN_MESSAGE, clip_text

    sentences = "; ".join(f"clause {index} says something whole" for index in range(100))
    clipped = clip_text(sentences)
    assert len(clipped) <= MAX_SHOWN_MESSAGE
    assert clipped.endswith("something whole; ...")
    assert clip_text("short; message") == "short; message"
    huge_name = "x" * 5000
    assert len(clip_text(f"unknown key '{huge_name}'")) <= MAX_SHOWN_MESSAGE
