"""Property tests: random orders are accepted or rejected for the right reason.

Every verdict of ``check_orders`` is compared with an independent brute-force
checker written here from Eq. 8 alone (plus ``B`` before ``W`` when the
backward is split, which every strategy draws half of the time): set arithmetic for unknown, duplicate
and missing tasks, a scan of every same-stage edge for order violations, and a
step-by-step global simulation (run any stage whose next task has all its
predecessors done, or any missing task whose predecessors are done) for
deadlock.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from schedlang.lowering.legality import ViolationKind, check_orders
from schedlang.lowering.orders import gpipe_orders, one_f_one_b_orders
from schedlang.vocabulary.actions import ActionKind, TaskId

F, B, W = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.WEIGHT


def kinds(split):
    return (F, B, W) if split else (F, B)


def eq8_edges(P, M, N, split=False):
    """(predecessor, successor, constraint) straight from the five lines of Eq. 8, and B before W when split."""
    edges = []
    for a in range(M):
        for i in range(N):
            for r in range(P):
                if r >= 1:
                    edges.append((TaskId(F, r - 1, a, i), TaskId(F, r, a, i), "stage_forward"))
                if i >= 1:
                    edges.append((TaskId(F, r, a, i - 1), TaskId(F, r, a, i), "state_forward"))
                edges.append((TaskId(F, r, a, i), TaskId(B, r, a, i), "forward_backward"))
                if r < P - 1:
                    edges.append((TaskId(B, r + 1, a, i), TaskId(B, r, a, i), "stage_backward"))
                if i < N - 1:
                    edges.append((TaskId(B, r, a, i + 1), TaskId(B, r, a, i), "state_backward"))
                if split:
                    edges.append((TaskId(B, r, a, i), TaskId(W, r, a, i), "backward_weight"))
    return edges


def brute_force(P, M, N, orders, split=False):
    universe = {TaskId(k, r, a, i) for k in kinds(split) for r in range(P) for a in range(M) for i in range(N)}
    unknown, duplicate = Counter(), Counter()
    kept = [[] for _ in range(P)]
    for stage, order in enumerate(orders):
        for task in order:
            if stage >= P or task not in universe or task.stage != stage:
                unknown[task] += 1
            elif task in kept[stage]:
                duplicate[task] += 1
            else:
                kept[stage].append(task)
    present = {task for order in kept for task in order}
    missing = universe - present
    position = {task: order.index(task) for order in kept for task in order}
    edges = eq8_edges(P, M, N, split)
    violated = {
        (successor, predecessor, name)
        for predecessor, successor, name in edges
        if predecessor in position
        and successor in position
        and predecessor.stage == successor.stage
        and position[predecessor] > position[successor]
    }
    counted = [(p, s) for p, s, name in edges if (s, p, name) not in violated]
    predecessors = {task: [p for p, s in counted if s == task] for task in universe}
    done, heads = set(), [0] * P
    progress = True
    while progress:
        progress = False
        for task in missing - done:
            if all(p in done for p in predecessors[task]):
                done.add(task)
                progress = True
        for stage in range(P):
            if heads[stage] < len(kept[stage]):
                task = kept[stage][heads[stage]]
                if all(p in done for p in predecessors[task]):
                    done.add(task)
                    heads[stage] += 1
                    progress = True
    deadlock = any(heads[stage] < len(kept[stage]) for stage in range(P))
    return {
        "unknown": unknown,
        "duplicate": duplicate,
        "missing": missing,
        "order": violated,
        "deadlock": deadlock,
    }


def verdict(P, M, N, orders, split=False):
    report = check_orders((P, M, N), orders, split_backward=split)
    unknown = Counter()
    for violation in report.of_kind(ViolationKind.UNKNOWN_TASK):
        unknown.update(violation.tasks)
    return {
        "unknown": unknown,
        "duplicate": Counter(v.tasks[0] for v in report.of_kind(ViolationKind.DUPLICATE_TASK)),
        "missing": {v.tasks[0] for v in report.of_kind(ViolationKind.MISSING_TASK)},
        "order": {(v.tasks[0], v.tasks[1], v.dependency.value) for v in report.of_kind(ViolationKind.ORDER_VIOLATION)},
        "deadlock": bool(report.of_kind(ViolationKind.DEADLOCK)),
    }, report


dimensions = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))


@st.composite
def linear_extension_orders(draw):
    """A random global topological order of the task graph, projected onto the stages."""
    P, M, N = draw(dimensions)
    split = draw(st.booleans())
    edges = eq8_edges(P, M, N, split)
    waiting = Counter(s for _, s, _ in edges)
    successors = {}
    for p, s, _ in edges:
        successors.setdefault(p, []).append(s)
    ready = sorted(TaskId(k, r, a, i) for k in kinds(split) for r in range(P) for a in range(M) for i in range(N) if waiting[TaskId(k, r, a, i)] == 0)
    orders = [[] for _ in range(P)]
    while ready:
        task = ready.pop(draw(st.integers(0, len(ready) - 1)))
        orders[task.stage].append(task)
        for successor in successors.get(task, []):
            waiting[successor] -= 1
            if waiting[successor] == 0:
                ready.append(successor)
    return P, M, N, orders, split


@settings(max_examples=150, deadline=None)
@given(linear_extension_orders())
def test_every_projection_of_a_topological_order_is_legal(case):
    P, M, N, orders, split = case
    report = check_orders((P, M, N), orders, split_backward=split)
    assert report.is_legal, report.violations


@st.composite
def permuted_orders(draw):
    """A generated order with some stages' tasks shuffled."""
    P, M, N = draw(dimensions)
    split = draw(st.booleans())
    base = draw(st.sampled_from([gpipe_orders, one_f_one_b_orders]))(P, M, N, split_backward=split)
    orders = [list(draw(st.permutations(order))) if draw(st.booleans()) else list(order) for order in base]
    return P, M, N, orders, split


@settings(max_examples=250, deadline=None)
@given(permuted_orders())
def test_permuted_orders_match_brute_force(case):
    P, M, N, orders, split = case
    found, report = verdict(P, M, N, orders, split)
    expected = brute_force(P, M, N, orders, split)
    assert found == expected
    assert report.is_legal == (not expected["order"] and not expected["deadlock"])


@st.composite
def mutated_orders(draw):
    """A legal or permuted order with tasks dropped, repeated, moved to other stages or out of range (a W task in
    an unsplit schedule among them)."""
    P, M, N, orders, split = draw(st.one_of(linear_extension_orders(), permuted_orders()))
    for _ in range(draw(st.integers(1, 4))):
        stage = draw(st.integers(0, P - 1))
        order = orders[stage]
        mutation = draw(st.sampled_from(["drop", "repeat", "foreign", "out_of_range", "swap", "extra_stage"]))
        if mutation == "drop" and order:
            order.pop(draw(st.integers(0, len(order) - 1)))
        elif mutation == "repeat" and order:
            order.insert(draw(st.integers(0, len(order))), draw(st.sampled_from(order)))
        elif mutation == "foreign":
            other = draw(st.integers(0, P - 1))
            if orders[other]:
                order.insert(draw(st.integers(0, len(order))), draw(st.sampled_from(orders[other])))
        elif mutation == "out_of_range":
            task = TaskId(draw(st.sampled_from([F, B, W])), stage, draw(st.integers(0, M)), draw(st.integers(0, N)))
            order.insert(draw(st.integers(0, len(order))), task)
        elif mutation == "swap" and len(order) >= 2:
            index = draw(st.integers(0, len(order) - 2))
            order[index], order[index + 1] = order[index + 1], order[index]
        elif mutation == "extra_stage" and len(orders) == P:
            orders.append([TaskId(F, P, 0, 0)])
    return P, M, N, orders, split


@settings(max_examples=300, deadline=None)
@given(mutated_orders())
def test_mutated_orders_match_brute_force(case):
    P, M, N, orders, split = case
    found, _ = verdict(P, M, N, orders, split)
    assert found == brute_force(P, M, N, orders, split)
