"""``schedlang viz`` options a newcomer reaches for: the format read from ``-o``'s suffix and ``--width``."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from schedlang.cli import main
from schedlang.compiler import Pass, compile_schedule
from schedlang.lowering.cost import CostModelKind
from schedlang.lowering.export.gantt import render_gantt

SCHEDULES = Path(__file__).parent / "schedules"
EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize(("name", "opening"), [("graph.dot", b"digraph"), ("graph.gv", b"digraph"),
                                               ("trace.json", b"{"), ("chart.png", b"\x89PNG")])
def test_the_format_follows_the_output_suffix(tmp_path, name, opening):
    output = tmp_path / name
    assert main(["viz", str(SCHEDULES / "tiny.sched"), "-o", str(output)]) == 0
    assert output.read_bytes().startswith(opening)


def test_an_unknown_suffix_or_standard_output_without_format_is_refused_with_the_choices(tmp_path):
    with pytest.raises(SystemExit, match=r"cannot tell the format from .*x\.svg.*\.dot, \.gv, \.json, \.png"):
        main(["viz", str(SCHEDULES / "tiny.sched"), "-o", str(tmp_path / "x.svg")])
    with pytest.raises(SystemExit, match="give --format"):
        main(["viz", str(SCHEDULES / "tiny.sched"), "-o", "-"])
    assert not (tmp_path / "x.svg").exists()


def test_an_explicit_format_wins_over_the_suffix(tmp_path):
    output = tmp_path / "graph.txt"
    assert main(["viz", str(SCHEDULES / "tiny.sched"), "--format", "dot", "-o", str(output)]) == 0
    assert output.read_text().startswith("digraph")


@pytest.mark.parametrize("width", [1200, 2400])
def test_width_sets_the_png_width_in_pixels(tmp_path, width):
    output = tmp_path / "chart.png"
    arguments = ["viz", str(SCHEDULES / "tiny.sched"), "-o", str(output)]
    assert main(arguments + (["--width", str(width)] if width != 1200 else [])) == 0
    assert matplotlib.image.imread(output).shape[1] == width


@pytest.mark.parametrize(("arguments", "message"), [
    (["--width", "100"], "--width must be 300 to 32768 pixels, got 100"),
    (["--width", "2400", "--format", "dot"], "--width sizes the png chart; dot has no width"),
])
def test_width_out_of_bounds_or_off_png_is_refused(tmp_path, arguments, message):
    with pytest.raises(SystemExit, match=message):
        main(["viz", str(SCHEDULES / "tiny.sched"), "-o", str(tmp_path / "chart.png"), *arguments])


def _labelled_bars(width_inches: float) -> int:
    compilation = compile_schedule(EXAMPLES / "gla_stateflow.sched", Pass.COST, _unit_cost())
    figure = render_gantt(compilation.timeline, width_inches=width_inches)
    return sum(1 for text in figure.axes[0].texts if text.get_text())


def _unit_cost():
    from schedlang.compiler import CostSettings
    from schedlang.lowering.cost import Hardware

    return CostSettings(CostModelKind.UNIT, Hardware())


def test_a_wider_chart_labels_more_bars():
    assert _labelled_bars(4.0) < _labelled_bars(24.0)
