"""One kind of action and one parser: a task is an action with its stage inside (vocabulary/actions.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedlang.vocabulary.actions import Action, ActionKind, TaskId

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
