"""Timeline -> Chrome trace JSON (the Trace Event Format that Perfetto and chrome://tracing open).

Input: a :class:`Timeline` from the simulator (or built by hand); optionally
the token count of each sequence chunk. Output: a JSON object with

* one process per stage (``pid = stage + 1``, named ``stage r`` by an ``M``
  metadata event and sorted by stage); pid 0 is avoided because some viewers
  treat it as the idle/kernel process;
* one thread (track) per :class:`Stream` the stage uses, named after it
  (``compute``, ``send``, ``recv``). The simulator lets messages overlap (links
  never contend), and a trace track can only hold properly nested slices, so
  overlapping transfers spill onto extra lanes ``send #2``, ``send #3``, ...;
* an ``X`` (complete) event per compute interval, named in local form
  (``F0.1``), in category ``forward``, ``backward`` or ``weight`` (the ``W``
  tasks of a split backward), with ``args`` holding the task, stage, microbatch, chunk and,
  when known, the chunk's tokens;
* an ``X`` event per ``SEND``/``RECV`` interval (the simulator adds one on
  each side of every message that takes time), named after its message, e.g.
  ``send activation to 1F0.1``; intervals shorter than a nanosecond once
  scaled are left out, as no viewer can show them;
* per message, a flow (``s`` on the source task's compute slice, ``f`` with
  ``bp: "e"`` on the destination task's, one id per message) drawn as an arrow
  from one task to the other, including same-stage state hand-offs.

Timeline times are scaled by ``microseconds_per_time_unit`` (the trace format's
unit is the microsecond) and rounded to nanoseconds; a slice's duration is the
difference of its rounded ends, so back-to-back tasks never overlap. Events are
sorted and :func:`chrome_trace_json` writes keys sorted, so the text is
deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from schedlang.lowering.timeline import MessageInterval, Stream, TaskInterval, Timeline
from schedlang.vocabulary.actions import ActionKind, TaskId

_COMPUTE_THREAD_ID = 1
# Lane k of the send stream is thread 2 + 2k and of the recv stream 3 + 2k, so any number of lanes fits.
_FIRST_LANE_THREAD_ID: dict[Stream, int] = {Stream.SEND: 2, Stream.RECV: 3}
_KIND_CATEGORY: dict[ActionKind, str] = {
    ActionKind.FORWARD: "forward",
    ActionKind.BACKWARD: "backward",
    ActionKind.WEIGHT: "weight",  # the weight gradients of a split backward
}

MICROSECONDS_PER_UNIT_COST = 1000.0
"""Unit cost model: one full-sequence forward shows as 1 ms, so Perfetto's ruler reads in units."""

MICROSECONDS_PER_SECOND = 1_000_000.0


def _process_id(stage: int) -> int:
    return stage + 1


def _microseconds(time: float, scale: float) -> float:
    return round(time * scale, 3)


def _scaled_span(start: float, end: float, scale: float) -> tuple[float, float]:
    scaled_start = _microseconds(start, scale)
    return scaled_start, round(_microseconds(end, scale) - scaled_start, 3)


def _task_event(interval: TaskInterval, scale: float, chunk_lengths: Sequence[int] | None) -> dict[str, Any]:
    start, duration = _scaled_span(interval.start, interval.end, scale)
    if duration <= 0:
        raise ValueError(
            f"task {interval.task} has a non-positive duration ({interval.start} to {interval.end}); "
            "the simulator gives every task a positive cost"
        )
    task = interval.task
    args: dict[str, Any] = {"task": str(task), "stage": task.stage, "microbatch": task.microbatch, "chunk": task.chunk}
    if chunk_lengths is not None and 0 <= task.chunk < len(chunk_lengths):
        args["tokens"] = chunk_lengths[task.chunk]
    return {
        "ph": "X",
        "name": task.local_form(),
        "cat": _KIND_CATEGORY[task.kind],
        "pid": _process_id(task.stage),
        "tid": _COMPUTE_THREAD_ID,
        "ts": start,
        "dur": duration,
        "args": args,
    }


def _transfer_event(interval: TaskInterval, message: MessageInterval | None, scale: float) -> dict[str, Any] | None:
    """A send or recv slice (thread id set later, by lane), named after its message."""
    start, duration = _scaled_span(interval.start, interval.end, scale)
    if duration <= 0:
        return None
    if message is None:
        name, category, args = f"{interval.stream.value} {interval.task}", interval.stream.value, {}
    else:
        if interval.stream is Stream.SEND:
            name = f"send {message.kind.value} to {message.destination}"
        else:
            name = f"recv {message.kind.value} from {message.source}"
        category = message.kind.value
        args = {
            "kind": message.kind.value,
            "source": str(message.source),
            "destination": str(message.destination),
            "bytes": message.n_bytes,
        }
    return {
        "ph": "X",
        "name": name,
        "cat": category,
        "pid": _process_id(interval.task.stage),
        "ts": start,
        "dur": duration,
        "args": args,
    }


def _messages_by_transfer(messages: Sequence[MessageInterval]) -> dict[tuple, list[MessageInterval]]:
    """Messages keyed as the simulator keys their send and recv intervals: (stream, task, start, end)."""
    by_transfer: dict[tuple, list[MessageInterval]] = {}
    for message in messages:
        by_transfer.setdefault((Stream.SEND, message.source, message.start, message.end), []).append(message)
        by_transfer.setdefault((Stream.RECV, message.destination, message.start, message.end), []).append(message)
    return by_transfer


def _assign_lanes(events: list[dict[str, Any]], stream: Stream) -> None:
    """Give each transfer slice of one stage and stream the first lane free at its start."""
    lane_ends: list[float] = []
    for event in sorted(events, key=lambda event: (event["ts"], event["dur"], event["name"])):
        lane = next((index for index, end in enumerate(lane_ends) if end <= event["ts"]), len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(0.0)
        lane_ends[lane] = event["ts"] + event["dur"]
        event["tid"] = _FIRST_LANE_THREAD_ID[stream] + 2 * lane


def _flow_events(
    flow_id: int, message: MessageInterval, compute_slices: dict[TaskId, tuple[float, float]]
) -> list[dict[str, Any]]:
    """An ``s``/``f`` pair from the source task's slice to the destination task's slice.

    Both ends sit at the middle of their slice so each binds to its enclosing
    slice unambiguously (a point on a slice's edge may bind to a neighbour).
    """
    ends = []
    for phase, task in (("s", message.source), ("f", message.destination)):
        start, duration = compute_slices[task]
        event = {
            "ph": phase,
            "name": message.kind.value,
            "cat": message.kind.value,
            "id": flow_id,
            "pid": _process_id(task.stage),
            "tid": _COMPUTE_THREAD_ID,
            "ts": round(start + duration / 2, 3),
        }
        if phase == "f":
            event["bp"] = "e"
        ends.append(event)
    return ends


def _thread_name_and_sort_index(tid: int) -> tuple[str, int]:
    """Compute first, then every send lane, then every recv lane."""
    if tid == _COMPUTE_THREAD_ID:
        return Stream.COMPUTE.value, 0
    stream = Stream.SEND if tid % 2 == 0 else Stream.RECV
    lane = (tid - _FIRST_LANE_THREAD_ID[stream]) // 2
    name = stream.value if lane == 0 else f"{stream.value} #{lane + 1}"
    return name, (1 if stream is Stream.SEND else 2) * 1_000_000 + lane


def _metadata_events(threads_by_process: dict[int, set[int]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for pid in sorted(threads_by_process):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"stage {pid - 1}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid - 1}})
        for tid in sorted(threads_by_process[pid]):
            name, sort_index = _thread_name_and_sort_index(tid)
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append(
                {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort_index}}
            )
    return events


def _event_sort_key(event: dict[str, Any]) -> tuple:
    return (event["pid"], event["tid"], event["ts"], event["ph"], event["name"], event.get("id", -1))


def timeline_to_chrome_trace(
    timeline: Timeline,
    *,
    chunk_lengths: Sequence[int] | None = None,
    microseconds_per_time_unit: float = MICROSECONDS_PER_UNIT_COST,
    time_unit_name: str = "unit",
    name: str = "schedule",
) -> dict[str, Any]:
    """Build the trace object; see the module docstring for what it contains.

    Args:
        timeline: the simulated timeline.
        chunk_lengths: tokens of each sequence chunk, written into each task's args.
        microseconds_per_time_unit: how many trace microseconds one timeline unit is.
        time_unit_name: the timeline's unit, recorded in ``otherData``.
        name: the schedule's name, recorded in ``otherData``.
    """
    if microseconds_per_time_unit <= 0:
        raise ValueError(f"microseconds_per_time_unit must be positive, got {microseconds_per_time_unit}")
    scale = microseconds_per_time_unit
    by_transfer = _messages_by_transfer(timeline.messages)

    slice_events: list[dict[str, Any]] = []
    compute_slices: dict[TaskId, tuple[float, float]] = {}
    transfers: dict[tuple[int, Stream], list[dict[str, Any]]] = {}
    for interval in timeline.tasks:
        if interval.stream is Stream.COMPUTE:
            event = _task_event(interval, scale, chunk_lengths)
            compute_slices[interval.task] = (event["ts"], event["dur"])
        else:
            matching = by_transfer.get((interval.stream, interval.task, interval.start, interval.end))
            event = _transfer_event(interval, matching.pop(0) if matching else None, scale)
            if event is None:
                continue
            transfers.setdefault((interval.task.stage, interval.stream), []).append(event)
        slice_events.append(event)
    for (_, stream), events in transfers.items():
        _assign_lanes(events, stream)

    flow_events: list[dict[str, Any]] = []
    ordered_messages = sorted(
        timeline.messages,
        key=lambda message: (message.start, message.end, str(message.source), str(message.destination)),
    )
    for message in ordered_messages:
        missing = [task for task in (message.source, message.destination) if task not in compute_slices]
        if missing:
            raise ValueError(
                f"message {message.kind.value} {message.source}->{message.destination} names "
                f"{', '.join(map(str, missing))}, which the timeline never runs"
            )
        flow_events.extend(_flow_events(len(flow_events) // 2 + 1, message, compute_slices))

    threads_by_process: dict[int, set[int]] = {
        _process_id(stage): {_COMPUTE_THREAD_ID} for stage in range(timeline.n_stages)
    }
    for event in slice_events:
        threads_by_process.setdefault(event["pid"], set()).add(event["tid"])
    events = _metadata_events(threads_by_process)
    events.extend(sorted(slice_events + flow_events, key=_event_sort_key))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "schedule": name,
            "time_unit": time_unit_name,
            "microseconds_per_time_unit": microseconds_per_time_unit,
            "n_stages": timeline.n_stages,
            "makespan": round(timeline.makespan, 9),
            "bubble_fraction": round(timeline.bubble_fraction, 9),
            "peak_activations": [round(peak, 9) for peak in timeline.peak_activations],
        },
    }


def chrome_trace_json(trace: dict[str, Any]) -> str:
    """The trace as text: one event per line, keys sorted, so diffs stay readable."""
    event_lines = ",\n".join("  " + json.dumps(event, sort_keys=True) for event in trace["traceEvents"])
    other_keys = {key: value for key, value in trace.items() if key != "traceEvents"}
    header = json.dumps(other_keys, sort_keys=True, indent=1)[:-1].rstrip()
    separator = "," if other_keys else ""
    return f'{header}{separator}\n "traceEvents": [\n{event_lines}\n ]\n}}\n'


def write_chrome_trace(trace: dict[str, Any], path) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(chrome_trace_json(trace))
