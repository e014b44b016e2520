"""One kind of action and one parser: a task is an action with its stage inside (vocabulary/actions.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedlang.vocabulary.actions import Action, ActionKind, OffloadCopy, TaskId, next_backwards, offload_copies

COMPUTE = [kind for kind in ActionKind if kind.is_compute]


@given(st.sampled_from(list(ActionKind)), st.integers(0, 10**6), st.integers(0, 10**6))
def test_every_action_prints_and_parses_back(kind, microbatch, chunk):
    action = Action(kind, microbatch, chunk)
    assert Action.parse(str(action)) == action == Action.read(str(action))


@given(st.sampled_from(COMPUTE), st.integers(0, 999), st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_task_is_its_action_on_a_stage_and_both_texts_parse_back(kind, stage, microbatch, chunk):
    task = TaskId(kind, stage, microbatch, chunk)
    assert TaskId.parse(str(task)) == task
    assert task.action.on(stage) == task
    assert str(task) == f"{stage}{task.local_form()}"
    assert Action.parse(task.local_form()) == task.action


@pytest.mark.parametrize("text", ["1RECV_F0.1", "F0.1", "1X0.1", "1F0", "1F0.1.2", "1F0.-1"])
def test_what_is_not_a_task(text):
    with pytest.raises(ValueError, match="is not a task id"):
        TaskId.parse(text)


@pytest.mark.parametrize("text", ["0F0.1", "F0", "SEND0.1", "F\uff10.1", ""])
def test_what_is_not_an_action(text):
    assert Action.read(text) is None
    with pytest.raises(ValueError, match="is not a pipeline action"):
        Action.parse(text)


def test_a_message_is_no_task():
    with pytest.raises(ValueError, match="is a message, not a task"):
        Action(ActionKind.SEND_ACTIVATION, 0, 1).on(0)


def actions_of(text: str) -> tuple[Action, ...]:
    return tuple(Action.parse(word) for word in text.split())


@pytest.mark.parametrize(
    "order, expected",
    [
        # one stage, one microbatch: the last forward runs its backward next, the rest are prefetched in turn
        ("F0.0 F0.1 F0.2 B0.2 B0.1 B0.0", {(0, 0): "prefetched", (0, 1): "prefetched", (0, 2): "kept"}),
        # the first stage of 1f1b over two stages: its first backward follows another unit's forward
        ("F0.0 F0.1 F1.0 B0.1 F1.1 B0.0 B1.1 B1.0",
         {(0, 0): "prefetched", (0, 1): "exposed", (1, 0): "prefetched", (1, 1): "prefetched"}),
        # messages and W between are no compute action that matters: W0.1 sits between F and B of no unit
        ("RECV_F0.0 F0.0 SEND_F0.0 F0.1 RECV_B0.1 B0.1 W0.1 F1.0 B0.0 W0.0 F1.1 B1.1 B1.0",
         {(0, 0): "prefetched", (0, 1): "kept", (1, 0): "prefetched", (1, 1): "kept"}),
        # a W between a forward and its own backward makes that unit travel
        ("F0.0 F0.1 W9.9 B0.1 B0.0", {(0, 0): "prefetched", (0, 1): "exposed"}),
        # B0.0 would prefetch B2.0's unit, but F2.0 has not run yet: B2.0 fetches it itself
        ("F0.0 F1.0 B0.0 F2.0 F3.0 B2.0 B3.0 B1.0",
         {(0, 0): "exposed", (1, 0): "prefetched", (2, 0): "exposed", (3, 0): "prefetched"}),
    ],
)
def test_offload_copies_keep_a_forward_followed_by_its_backward_and_name_the_unprefetched_one(order, expected):
    actions = actions_of(order)
    copies = offload_copies(actions)
    assert {unit: copy.value for unit, copy in copies.items()} == expected
    backwards = [(action.microbatch, action.chunk) for action in actions if action.kind is ActionKind.BACKWARD]
    assert next_backwards(actions) == dict(zip(backwards, backwards[1:]))
    assert all(isinstance(copy, OffloadCopy) for copy in copies.values())
