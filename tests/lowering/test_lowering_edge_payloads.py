"""What each row of the edge table carries ([Note: edge rules]), read by placement and the memory model.

A changed or added row is written once, here, and placement's action lists and the memory walk follow it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from enum import Enum

import pytest

from schedlang.frontend import load_program_text
from schedlang.lowering.memory_peak import Component, graph_slots, predict_memory
from schedlang.lowering.memory_terms import activation_message_bytes
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders
from schedlang.lowering.placement import place_stage_actions
from schedlang.vocabulary.actions import Action, ActionKind
from schedlang.vocabulary.edges import EDGE_RULES, Dependency, EdgeRule, EdgeRules, Payload

F, B, W = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.WEIGHT

SCHEDULE = """\
schedule payloads
model {{ vocab = 256  d_model = 64  layers = [gla] * 2  heads = 2  head_dim = 32  mlp = swiglu(ratio = 4) }}
mesh {{ pipeline = 2 }}
sequence {{ length = 1024  chunks = 2  kernel_chunk = 64 }}
pipeline {{ microbatches = 3  order = {order}  {more} }}
train {{ steps = 1  dtype = bf16 }}
"""


def program_of(order: str = "gpipe", more: str = ""):
    return load_program_text(SCHEDULE.format(order=order, more=more))


class MadeUpDependency(str, Enum):
    """A dependency only this file's tables have."""

    ACTIVATION_AGAIN = "activation_again"


ACTIVATION_AGAIN = EdgeRule(
    MadeUpDependency.ACTIVATION_AGAIN,  # type: ignore[arg-type]  # a name outside Dependency, on purpose
    F,
    B,
    stage_offset=-1,
    chunk_offset=0,
    payload=Payload.ACTIVATION,
    reason="a made-up rule: a stage's backward reads the previous stage's activation once more",
)
WITH_ACTIVATION_AGAIN = EDGE_RULES + (ACTIVATION_AGAIN,)


def with_payload(dependency: Dependency, payload: Payload) -> EdgeRules:
    """The real table with one row carrying something else."""
    rows = (replace(rule, payload=payload) if rule.dependency is dependency else rule for rule in EDGE_RULES)
    return EdgeRules(*rows)


def test_each_row_carries_one_payload_and_the_messages_are_the_rows_that_cross_stages():
    carried = {rule.dependency: rule.payload for rule in EDGE_RULES}
    assert carried == {
        Dependency.STAGE_FORWARD: Payload.ACTIVATION,
        Dependency.STATE_FORWARD: Payload.STATE,
        Dependency.FORWARD_BACKWARD: Payload.SAVED,
        Dependency.STAGE_BACKWARD: Payload.ACTIVATION_GRADIENT,
        Dependency.STATE_BACKWARD: Payload.STATE_GRADIENT,
        Dependency.BACKWARD_WEIGHT: Payload.SAVED,
    }
    assert [rule.dependency for rule in EDGE_RULES.messages(True)] == [
        Dependency.STAGE_FORWARD,
        Dependency.STAGE_BACKWARD,
    ]
    assert [rule.dependency for rule in EDGE_RULES.hand_offs(True)] == [
        Dependency.STATE_FORWARD,
        Dependency.STATE_BACKWARD,
    ]
    assert EDGE_RULES.releasing_kind(False) is B
    assert EDGE_RULES.releasing_kind(True) is W


def test_a_row_that_crosses_stages_with_a_payload_no_action_sends_is_refused():
    with pytest.raises(ValueError, match="crosses stages with state"):
        replace(ACTIVATION_AGAIN, payload=Payload.STATE)


def test_an_added_message_row_is_sent_and_received_by_placement():
    n_stages, n_microbatches, n_chunks = 2, 3, 2
    orders = one_f_one_b_orders(n_stages, n_microbatches, n_chunks)
    plain = place_stage_actions(orders, n_chunks)
    placed = place_stage_actions(orders, n_chunks, WITH_ACTIVATION_AGAIN)
    units = [(a, i) for a in range(n_microbatches) for i in range(n_chunks)]
    # stage 0 sends every forward's output twice, once per row; stage 1 receives it twice, the second time
    # before its backward at the latest, in stage 0's send order
    assert Counter(action for action in placed[0] if action.kind is ActionKind.SEND_ACTIVATION) == Counter(
        {Action(ActionKind.SEND_ACTIVATION, *unit): 2 for unit in units}
    )
    receives = [action for action in placed[1] if action.kind is ActionKind.RECV_ACTIVATION]
    assert Counter(receives) == Counter({Action(ActionKind.RECV_ACTIVATION, *unit): 2 for unit in units})
    for unit in units:
        backward = placed[1].index(Action(B, *unit))
        assert placed[1][:backward].count(Action(ActionKind.RECV_ACTIVATION, *unit)) == 2
    # nothing else moves: the gradients are placed as before
    activations = (ActionKind.RECV_ACTIVATION, ActionKind.SEND_ACTIVATION)
    for stage in range(n_stages):
        assert [action for action in placed[stage] if action.kind not in activations] == [
            action for action in plain[stage] if action.kind not in activations
        ]


def test_an_added_message_row_is_held_by_the_memory_model():
    program = program_of()
    orders = gpipe_orders(2, 3, 2)
    message = activation_message_bytes(program, 0)
    plain = predict_memory(program, orders)[0]
    again = predict_memory(program, orders, rules=WITH_ACTIVATION_AGAIN)[0]
    # gpipe's first stage peaks in its first backward: every forward sent its output (twice with the added
    # row) and the backward holds the gradient it received
    assert plain.components[Component.COMMUNICATION] == pytest.approx((3 * 2 + 1) * message)
    assert again.components[Component.COMMUNICATION] == pytest.approx((2 * 3 * 2 + 1) * message)
    # the last stage receives the added activation, which a chunk keeps with its own: nothing else changes
    assert predict_memory(program, orders, rules=WITH_ACTIVATION_AGAIN)[1] == predict_memory(program, orders)[1]


def test_the_row_that_lets_w_read_what_the_forward_saved_keeps_the_chunk_until_w():
    program = program_of(order="1f1b", more="split_backward = true")
    n_stages, n_microbatches, n_chunks = 2, 3, 2
    # every W at the end of the step: with the real table the chunks stay until then
    orders = [
        [task for task in order if task.kind is not W] + [task for task in order if task.kind is W]
        for order in one_f_one_b_orders(n_stages, n_microbatches, n_chunks, split_backward=True)
    ]
    unsplit = one_f_one_b_orders(n_stages, n_microbatches, n_chunks)
    moved = with_payload(Dependency.BACKWARD_WEIGHT, Payload.STATE_GRADIENT)  # W no longer reads the forward's
    assert moved.releasing_kind(True) is B
    for stage in range(n_stages):
        assert graph_slots(program, orders[stage]) == n_microbatches * n_chunks
        assert graph_slots(program, orders[stage], moved) == graph_slots(program_of("1f1b"), unsplit[stage])
        assert graph_slots(program, orders[stage], moved) < n_microbatches * n_chunks
        real = predict_memory(program, orders)[stage]
        freed_at_backward = predict_memory(program, orders, rules=moved)[stage]
        assert freed_at_backward.components[Component.ACTIVATIONS] < real.components[Component.ACTIVATIONS]
