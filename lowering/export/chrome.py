"""Timeline -> Chrome trace JSON (the Trace Event Format that Perfetto and chrome://tracing open).

Input: a :class:`Timeline` from the simulator (or built by hand); optionally
the token count of each sequence chunk. Output: a JSON object with

* one process per stage (``pid = stage + 1``, named ``stage r`` by an ``M``
  metadata event and sorted by stage): pid 0 is avoided because some viewers
  treat it as the idle/kernel process;
* one thread (track) per :class:`Stream` that the stage uses, named after the
  stream (``compute``, ``send``, ``recv``);
* an ``X`` (complete) event per task interval, with ``args`` holding the stage,
  microbatch, chunk and, when known, the chunk's tokens;
* per message: ``X`` events on the sender's ``send`` and the receiver's
  ``recv`` track when it takes time, and a flow (``s`` on the source task,
  ``f`` with ``bp: "e"`` on the destination task, one id per message) drawn as
  an arrow from one task to the other. Same-stage state hand-offs are flows
  only.

Timeline times are scaled by ``microseconds_per_time_unit`` (the trace format's
unit is the microsecond) and rounded to nanoseconds. Events are sorted and
:func:`chrome_trace_json` writes keys sorted, so the text is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from schedlang.lowering.tasks import TaskId, TaskKind
from schedlang.lowering.timeline import MessageInterval, Stream, TaskInterval, Timeline

_STREAM_THREAD_IDS: dict[Stream, int] = {Stream.COMPUTE: 1, Stream.SEND: 2, Stream.RECV: 3}
_KIND_CATEGORY: dict[TaskKind, str] = {TaskKind.FORWARD: "forward", TaskKind.BACKWARD: "backward"}

MICROSECONDS_PER_UNIT_COST = 1000.0
"""Unit cost model: one full-sequence forward shows as 1 ms, so Perfetto's ruler reads in units."""

MICROSECONDS_PER_SECOND = 1_000_000.0


def _process_id(stage: int) -> int:
    return stage + 1


def _microseconds(time: float, scale: float) -> float:
    return round(time * scale, 3)


def _task_args(task: TaskId, chunk_lengths: Sequence[int] | None) -> dict[str, Any]:
    args: dict[str, Any] = {
        "task": str(task),
        "stage": task.stage,
        "microbatch": task.microbatch,
        "chunk": task.chunk,
    }
    if chunk_lengths is not None and 0 <= task.chunk < len(chunk_lengths):
        args["tokens"] = chunk_lengths[task.chunk]
    return args


def _task_event(interval: TaskInterval, scale: float, chunk_lengths: Sequence[int] | None) -> dict[str, Any]:
    start = _microseconds(interval.start, scale)
    duration = round(_microseconds(interval.end, scale) - start, 3)
    if duration <= 0:
        raise ValueError(
            f"task {interval.task} has a non-positive duration ({interval.start} to {interval.end}); "
            "the simulator gives every task a positive cost"
        )
    return {
        "ph": "X",
        "name": interval.task.local_form(),
        "cat": _KIND_CATEGORY[interval.task.kind],
        "pid": _process_id(interval.task.stage),
        "tid": _STREAM_THREAD_IDS[interval.stream],
        "ts": start,
        "dur": duration,
        "args": _task_args(interval.task, chunk_lengths),
    }


def _message_args(message: MessageInterval) -> dict[str, Any]:
    return {
        "kind": message.kind.value,
        "source": str(message.source),
        "destination": str(message.destination),
        "bytes": message.n_bytes,
    }


def _message_slices(message: MessageInterval, scale: float) -> list[dict[str, Any]]:
    """The send and recv slices of a message that takes time; none for an instant hand-off."""
    start = _microseconds(message.start, scale)
    duration = round(_microseconds(message.end, scale) - start, 3)
    if duration <= 0:
        return []
    name = f"{message.kind.value} {message.source}->{message.destination}"
    common = {"ph": "X", "name": name, "cat": message.kind.value, "ts": start, "dur": duration}
    return [
        {**common, "pid": _process_id(message.source.stage), "tid": _STREAM_THREAD_IDS[Stream.SEND],
         "args": _message_args(message)},
        {**common, "pid": _process_id(message.destination.stage), "tid": _STREAM_THREAD_IDS[Stream.RECV],
         "args": _message_args(message)},
    ]


def _flow_events(
    flow_id: int, message: MessageInterval, compute_slices: dict[TaskId, tuple[float, float]]
) -> list[dict[str, Any]]:
    """An ``s``/``f`` pair from the source task's slice to the destination task's slice.

    Both ends sit at the middle of their slice so each binds to its enclosing
    slice unambiguously (a point on a slice's edge may bind to a neighbour).
    """
    source_start, source_duration = compute_slices[message.source]
    destination_start, destination_duration = compute_slices[message.destination]
    common = {"name": message.kind.value, "cat": message.kind.value, "id": flow_id}
    return [
        {**common, "ph": "s", "pid": _process_id(message.source.stage), "tid": _STREAM_THREAD_IDS[Stream.COMPUTE],
         "ts": round(source_start + source_duration / 2, 3)},
        {**common, "ph": "f", "bp": "e", "pid": _process_id(message.destination.stage),
         "tid": _STREAM_THREAD_IDS[Stream.COMPUTE], "ts": round(destination_start + destination_duration / 2, 3)},
    ]


def _metadata_events(stages: Sequence[int], streams_by_stage: dict[int, set[Stream]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for stage in stages:
        pid = _process_id(stage)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"stage {stage}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": stage}})
        for stream in sorted(streams_by_stage.get(stage, set()), key=_STREAM_THREAD_IDS.__getitem__):
            tid = _STREAM_THREAD_IDS[stream]
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream.value}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
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
    streams_by_stage: dict[int, set[Stream]] = {stage: {Stream.COMPUTE} for stage in range(timeline.n_stages)}

    slice_events = [_task_event(interval, scale, chunk_lengths) for interval in timeline.tasks]
    compute_slices: dict[TaskId, tuple[float, float]] = {}
    for interval, event in zip(timeline.tasks, slice_events):
        streams_by_stage.setdefault(interval.task.stage, set()).add(interval.stream)
        if interval.stream is Stream.COMPUTE:
            compute_slices[interval.task] = (event["ts"], event["dur"])

    flow_events: list[dict[str, Any]] = []
    ordered_messages = sorted(
        timeline.messages, key=lambda message: (message.start, message.end, str(message.source), str(message.destination))
    )
    for message in ordered_messages:
        for event in _message_slices(message, scale):
            slice_events.append(event)
            streams_by_stage.setdefault(event["pid"] - 1, set()).add(
                Stream.SEND if event["tid"] == _STREAM_THREAD_IDS[Stream.SEND] else Stream.RECV
            )
        missing = [task for task in (message.source, message.destination) if task not in compute_slices]
        if missing:
            raise ValueError(
                f"message {message.kind.value} {message.source}->{message.destination} names "
                f"{', '.join(map(str, missing))}, which the timeline never runs"
            )
        flow_events.extend(_flow_events(len(flow_events) // 2 + 1, message, compute_slices))

    events = _metadata_events(sorted(streams_by_stage), streams_by_stage)
    events.extend(sorted(slice_events + flow_events, key=_event_sort_key))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "schedule": name,
            "time_unit": time_unit_name,
            "microseconds_per_time_unit": microseconds_per_time_unit,
            "n_stages": timeline.n_stages,
            "makespan": timeline.makespan,
            "bubble_fraction": round(timeline.bubble_fraction, 9),
            "peak_activations": list(timeline.peak_activations),
        },
    }


def chrome_trace_json(trace: dict[str, Any]) -> str:
    """The trace as text: one event per line, keys sorted, so diffs stay readable."""
    event_lines = ",\n".join("  " + json.dumps(event, sort_keys=True) for event in trace["traceEvents"])
    other_keys = {key: value for key, value in trace.items() if key != "traceEvents"}
    header = json.dumps(other_keys, sort_keys=True, indent=1)[:-1].rstrip()
    separator = "," if other_keys else ""
    return f'{header}{separator}\n "traceEvents": [\n{event_lines}\n ]\n}}\n'
