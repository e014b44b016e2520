"""The Chrome trace exporter: golden text for the tiny schedule and the Trace Event Format's structure rules."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from export_programs import tiny_program
from schedlang.frontend import load_program
from schedlang.lowering.cost import CostModelKind
from schedlang.lowering.export.chrome import (
    MICROSECONDS_PER_SECOND,
    chrome_trace_json,
    timeline_to_chrome_trace,
    write_chrome_trace,
)
from schedlang.lowering.graph import chunk_tokens
from schedlang.lowering.simulate import simulate
from schedlang.lowering.timeline import MessageInterval, Stream, TaskInterval, Timeline
from schedlang.vocabulary.actions import TaskId
from schedlang.vocabulary.edges import Payload


def _trace_of(program, cost_model=CostModelKind.UNIT):
    timeline = simulate(program, cost_model=cost_model)
    scale = 1000.0 if cost_model is CostModelKind.UNIT else MICROSECONDS_PER_SECOND
    trace = timeline_to_chrome_trace(
        timeline, chunk_lengths=chunk_tokens(program), microseconds_per_time_unit=scale, name=program.name
    )
    return timeline, trace


def _enclosing_slice(slices, pid, tid, ts):
    found = [event for event in slices[pid, tid] if event["ts"] <= ts <= event["ts"] + event["dur"]]
    assert len(found) == 1, f"{len(found)} slices enclose ts={ts} on pid {pid} tid {tid}"
    return found[0]


def check_trace_structure(trace, timeline):
    """Every rule a viewer relies on; returns the slices by (pid, tid) for further checks."""
    assert json.loads(chrome_trace_json(trace)) == trace
    events = trace["traceEvents"]
    assert {event["ph"] for event in events} <= {"M", "X", "s", "f"}

    slices = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            assert event["dur"] > 0 and event["ts"] >= 0, event
            slices[event["pid"], event["tid"]].append(event)
    for key, track in slices.items():
        track.sort(key=lambda event: event["ts"])
        for earlier, later in zip(track, track[1:]):
            assert earlier["ts"] + earlier["dur"] <= later["ts"] + 1e-9, f"overlapping slices on {key}"

    names = {(event["pid"], event["tid"], event["name"]): event["args"] for event in events if event["ph"] == "M"}
    for pid, tid in slices:
        assert names[pid, 0, "process_name"] == {"name": f"stage {pid - 1}"}
        assert (pid, tid, "thread_name") in names
    assert {pid for pid, _ in slices if True} >= {stage + 1 for stage in range(timeline.n_stages)}

    compute = [event for event in events if event["ph"] == "X" and event["tid"] == 1]
    assert Counter(event["args"]["task"] for event in compute) == Counter(
        str(interval.task) for interval in timeline.tasks if interval.stream is Stream.COMPUTE
    )

    flows = defaultdict(dict)
    for event in events:
        if event["ph"] in ("s", "f"):
            assert event["ph"] not in flows[event["id"]], f"flow {event['id']} has two {event['ph']} events"
            flows[event["id"]][event["ph"]] = event
    assert len(flows) == len(timeline.messages)
    expected_pairs = Counter((str(m.source), str(m.destination), m.kind.value) for m in timeline.messages)
    found_pairs = Counter()
    for flow_id, ends in flows.items():
        assert set(ends) == {"s", "f"}, f"flow {flow_id} is not paired"
        start, finish = ends["s"], ends["f"]
        assert (start["name"], start["cat"]) == (finish["name"], finish["cat"])
        assert finish["bp"] == "e"
        source = _enclosing_slice(slices, start["pid"], start["tid"], start["ts"])
        destination = _enclosing_slice(slices, finish["pid"], finish["tid"], finish["ts"])
        found_pairs[source["args"]["task"], destination["args"]["task"], start["cat"]] += 1
    assert found_pairs == expected_pairs
    return slices


def test_tiny_unit_trace_matches_golden(golden, tiny):
    _, trace = _trace_of(tiny)
    golden("tiny_1f1b_unit.trace.json", chrome_trace_json(trace))


@pytest.mark.parametrize("cost_model", list(CostModelKind))
@pytest.mark.parametrize(("order", "n_chunks"), [("1f1b", 2), ("gpipe", 3), ("1f1b", 1)])
def test_simulated_traces_are_well_formed(cost_model, order, n_chunks):
    timeline, trace = _trace_of(tiny_program(order, n_chunks, n_microbatches=3), cost_model)
    check_trace_structure(trace, timeline)


@pytest.mark.parametrize("cost_model", list(CostModelKind))
@pytest.mark.parametrize(
    "example", sorted(path.name for path in (Path(__file__).parents[2] / "examples").glob("*.sched"))
)
def test_every_example_gives_a_well_formed_trace(cost_model, example):
    program = load_program(Path(__file__).parents[2] / "examples" / example)
    timeline, trace = _trace_of(program, cost_model)
    check_trace_structure(trace, timeline)


def test_compute_slices_carry_task_fields_and_tokens(tiny):
    timeline, trace = _trace_of(tiny)
    compute = [event for event in trace["traceEvents"] if event["ph"] == "X" and event["tid"] == 1]
    for event in compute:
        task = TaskId.parse(event["args"]["task"])
        assert event["name"] == task.local_form()
        assert event["pid"] == task.stage + 1
        assert event["cat"] == ("forward" if task.kind.value == "F" else "backward")
        assert (event["args"]["microbatch"], event["args"]["chunk"]) == (task.microbatch, task.chunk)
        assert event["args"]["tokens"] == 128
    unit_forward = [event["dur"] for event in compute if event["cat"] == "forward"]
    assert set(unit_forward) == {500.0}, "a half-sequence chunk's forward is 0.5 units = 500 us"
    assert trace["otherData"]["makespan"] == timeline.makespan


@pytest.mark.parametrize("cost_model", list(CostModelKind))
@pytest.mark.parametrize("order", ["1f1b", "gpipe"])
def test_split_backward_weight_tasks_are_slices_of_category_weight(cost_model, order):
    program = tiny_program(order, 2, n_microbatches=3, split_backward=True)
    timeline, trace = _trace_of(program, cost_model)
    check_trace_structure(trace, timeline)
    compute = [event for event in trace["traceEvents"] if event["ph"] == "X" and event["tid"] == 1]
    categories = {"F": "forward", "B": "backward", "W": "weight"}
    assert all(event["cat"] == categories[event["name"][0]] for event in compute)
    weights = [event for event in compute if event["cat"] == "weight"]
    assert len(weights) == 2 * 3 * 2
    # no message starts or ends at a W task: it waits for its B on the same stage, with no data to move
    flow_ends = {(event["pid"], event["ts"]) for event in trace["traceEvents"] if event["ph"] in "sf"}
    assert not any(
        pid == event["pid"] and event["ts"] < ts < event["ts"] + event["dur"]
        for event in weights
        for pid, ts in flow_ends
    )
    if cost_model is CostModelKind.UNIT:
        assert {event["dur"] for event in compute if event["cat"] != "forward"} == {500.0}


def test_flops_trace_has_send_and_recv_tracks_with_lanes_for_overlaps():
    timeline, trace = _trace_of(tiny_program("1f1b", 2, n_microbatches=3), CostModelKind.FLOPS)
    slices = check_trace_structure(trace, timeline)
    thread_names = {
        (event["pid"], event["tid"]): event["args"]["name"]
        for event in trace["traceEvents"]
        if event["ph"] == "M" and event["name"] == "thread_name"
    }
    by_stream = {"send": [], "recv": []}
    for (pid, tid), track in slices.items():
        stream = thread_names[pid, tid].split()[0]
        if stream in by_stream:
            by_stream[stream].extend(track)
    sends, receives = by_stream["send"], by_stream["recv"]
    transfers = [interval for interval in timeline.tasks if interval.stream is not Stream.COMPUTE]
    assert len(sends) + len(receives) == len(transfers) > 0
    assert all(event["name"].startswith("send activation") for event in sends if event["pid"] == 1)
    assert all(event["args"]["bytes"] > 0 for event in sends + receives)


def _hand_timeline(message_end: float) -> Timeline:
    first, second = TaskId.forward(0, 0, 0), TaskId.forward(1, 0, 0)
    return Timeline(
        n_stages=2,
        tasks=(
            TaskInterval(first, 0.0, 1.0),
            TaskInterval(second, message_end, message_end + 1.0),
            TaskInterval(first, 1.0, message_end, Stream.SEND),
            TaskInterval(second, 1.0, message_end, Stream.RECV),
        ),
        messages=(MessageInterval(Payload.ACTIVATION, first, second, 1.0, message_end, 64),),
        makespan=message_end + 1.0,
        peak_activations=(1.0, 1.0),
    )


def test_transfers_too_short_to_show_are_left_out_but_keep_their_flow():
    trace = timeline_to_chrome_trace(_hand_timeline(1.0 + 1e-9))
    names = [event["name"] for event in trace["traceEvents"] if event["ph"] == "X"]
    assert names == ["F0.0", "F0.0"]
    assert sorted(event["ph"] for event in trace["traceEvents"] if event["ph"] in "sf") == ["f", "s"]


def test_time_scale_is_applied():
    trace = timeline_to_chrome_trace(_hand_timeline(1.5), microseconds_per_time_unit=MICROSECONDS_PER_SECOND)
    second_task = [
        event for event in trace["traceEvents"] if event["ph"] == "X" and (event["pid"], event["tid"]) == (2, 1)
    ]
    assert (second_task[0]["ts"], second_task[0]["dur"]) == (1_500_000.0, 1_000_000.0)


def test_message_naming_an_unknown_task_is_an_error():
    timeline = _hand_timeline(1.5)
    broken = Timeline(2, timeline.tasks[:1], timeline.messages, timeline.makespan, timeline.peak_activations)
    with pytest.raises(ValueError, match="1F0.0, which the timeline never runs"):
        timeline_to_chrome_trace(broken)


def test_zero_length_task_is_an_error():
    task = TaskId.forward(0, 0, 0)
    timeline = Timeline(1, (TaskInterval(task, 1.0, 1.0),), (), 1.0, (0.0,))
    with pytest.raises(ValueError, match="non-positive duration"):
        timeline_to_chrome_trace(timeline)


def test_written_file_is_the_json_text(tmp_path, tiny):
    _, trace = _trace_of(tiny)
    path = tmp_path / "trace.json"
    write_chrome_trace(trace, path)
    assert json.loads(path.read_text()) == trace
