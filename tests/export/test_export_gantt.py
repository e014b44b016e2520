"""The PNG Gantt chart: written, decodable, sized by the stage count, and showing the schedule's bars."""

from __future__ import annotations

import io

import matplotlib.image
import numpy as np
import pytest

from export_programs import tiny_program
from schedlang.lowering.cost import CostModelKind
from schedlang.lowering.export.gantt import gantt_png, render_gantt, write_gantt_png
from schedlang.lowering.simulate import simulate
from schedlang.lowering.timeline import Stream

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _decode(png: bytes) -> np.ndarray:
    assert png.startswith(_PNG_SIGNATURE)
    return matplotlib.image.imread(io.BytesIO(png), format="png")


def test_png_is_written_and_decodable(tmp_path, tiny):
    path = tmp_path / "tiny.png"
    write_gantt_png(simulate(tiny), path, title="tiny")
    pixels = _decode(path.read_bytes())
    height, width = pixels.shape[:2]
    assert (width, height) == (1200, 210), "12 x 2.1 inches at 100 dpi for two stages"
    assert pixels[..., :3].std() > 0.05, "the image is not blank"


def test_height_grows_with_stages():
    four_stage_rows = _decode(gantt_png(simulate(tiny_program("gpipe", 1)), width_inches=6.0)).shape
    assert four_stage_rows[:2] == (210, 600)


def test_bars_labels_and_title_follow_the_timeline(tiny):
    timeline = simulate(tiny)
    figure = render_gantt(timeline, title="tiny")
    axes = figure.axes[0]
    compute = [interval for interval in timeline.tasks if interval.stream is Stream.COMPUTE]
    assert len(axes.collections) == len(compute)
    bars = []
    for collection in axes.collections:
        corners = collection.get_paths()[0].vertices
        row = (corners[:, 1].min() + corners[:, 1].max()) / 2
        bars.append((round(corners[:, 0].min(), 6), round(corners[:, 0].max(), 6), round(row, 6)))
    expected = [(round(interval.start, 6), round(interval.end, 6), float(interval.task.stage)) for interval in compute]
    assert sorted(bars) == sorted(expected)
    labels = sorted(text.get_text() for text in axes.texts)
    assert labels == sorted(interval.task.local_form() for interval in compute), "tiny bars are wide enough to label"
    assert axes.get_title() == "tiny: makespan 7.5 unit, bubble fraction 20.0%"
    assert [label.get_text() for label in axes.get_yticklabels()] == ["stage 0", "stage 1"]


def test_labels_are_shortened_then_dropped_when_bars_are_narrow():
    timeline = simulate(tiny_program("1f1b", 8, n_microbatches=8))
    label_sets = {
        width: [text.get_text() for text in render_gantt(timeline, width_inches=width).axes[0].texts]
        for width in (8.0, 24.0, 40.0)
    }
    assert label_sets[8.0] == []
    assert sorted(label_sets[24.0]) == sorted(
        f"{interval.task.microbatch}.{interval.task.chunk}"
        for interval in timeline.tasks
        if interval.task.kind.value == "B"
    ), "backwards are twice as wide as forwards: only they fit the short form"
    assert all(label[0] in "FB" for label in label_sets[40.0]) and len(label_sets[40.0]) == len(label_sets[24.0])


def test_forward_and_backward_colours_differ_and_microbatches_alternate(tiny):
    axes = render_gantt(simulate(tiny)).axes[0]
    colours = {}
    for collection, label in zip(axes.collections, axes.texts):
        colours.setdefault(label.get_text()[0], {}).setdefault(label.get_text()[1], set()).add(
            tuple(np.round(collection.get_facecolor()[0], 3))
        )
    assert colours["F"]["0"].isdisjoint(colours["B"]["0"])
    assert colours["F"]["0"].isdisjoint(colours["F"]["1"])


def _legend_labels(figure):
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def test_weight_tasks_get_their_own_shades_and_a_legend_entry():
    timeline = simulate(tiny_program("1f1b", 2, split_backward=True))
    figure = render_gantt(timeline, title="tiny", width_inches=24.0)
    axes = figure.axes[0]
    compute = [interval for interval in timeline.tasks if interval.stream is Stream.COMPUTE]
    assert len(axes.collections) == len(compute) == 24
    colours = {}
    for collection, label in zip(axes.collections, axes.texts):
        kind, microbatch = label.get_text()[0], label.get_text()[1]
        colours.setdefault(kind, {}).setdefault(microbatch, set()).add(tuple(np.round(collection.get_facecolor()[0], 3)))
    assert set(colours) == {"F", "B", "W"}
    for kind in "FB":
        assert colours["W"]["0"].isdisjoint(colours[kind]["0"])
    assert colours["W"]["0"].isdisjoint(colours["W"]["1"]), "microbatches alternate shades"
    assert _legend_labels(figure) == ["forward", "backward", "weight gradients"]
    assert _legend_labels(render_gantt(simulate(tiny_program()))) == ["forward", "backward"]
    assert len(gantt_png(timeline)) > 1000


@pytest.mark.parametrize("cost_model", list(CostModelKind))
def test_both_cost_models_render(cost_model, tiny):
    assert len(gantt_png(simulate(tiny, cost_model=cost_model), time_unit_name="s")) > 1000
