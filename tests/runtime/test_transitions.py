"""The transition tables and the rules derived from them.

Every named edge is allowed under its name, every other pair of states is refused, and the
per-task counters that ``status_deltas`` maintains always describe the operations that exist:
checked on the database against a recount of the operations' statuses by an oracle written out
from the documented rule, so the condition the journal statement derives from them is right.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.errors import InvalidTransition
from runtime.rules.statuses import (
    MACHINES,
    OPERATION,
    TASK,
    Edge,
    Machine,
    OperationStatus,
    TaskCondition,
    task_condition_for,
)
from runtime.transitions.status import status_deltas

S = OperationStatus
C = TaskCondition

EDGES = [(m.name, e) for m in MACHINES.values() for e in m.edges]
NON_EDGES = [
    (m.name, source, target)
    for m in MACHINES.values()
    for source, target in itertools.product(m.states, repeat=2)
    if (source, target) not in {(e.source, e.target) for e in m.edges}
]


def test_every_machine_has_edges_and_refusals():
    assert set(MACHINES) == {"operation", "task", "cancellation", "approval"}
    for machine in MACHINES.values():
        assert machine.edges
        assert any(name == machine.name for name, *_ in NON_EDGES)


@pytest.mark.parametrize(
    ("machine", "edge"), EDGES, ids=[f"{m}:{e.source}->{e.target}" for m, e in EDGES]
)
def test_every_edge_in_the_table_is_allowed_under_its_name(machine: str, edge: Edge):
    m = MACHINES[machine]
    assert m.check(edge.source, edge.target) == edge.name
    assert m.allows(edge.source, edge.target)
    assert edge.target in m.targets(edge.source)
    assert edge.source in m.sources_of(edge.target)


@pytest.mark.parametrize(
    ("machine", "source", "target"), NON_EDGES, ids=[f"{m}:{s}->{t}" for m, s, t in NON_EDGES]
)
def test_every_other_pair_of_states_is_refused(machine: str, source: str, target: str):
    m = MACHINES[machine]
    assert not m.allows(source, target)
    with pytest.raises(InvalidTransition) as caught:
        m.check(source, target)
    assert caught.value.code == "invalid_transition"
    assert caught.value.status == 409
    assert caught.value.details == {"source": source, "target": target}


@given(
    machine=st.sampled_from(sorted(MACHINES)),
    source=st.text(max_size=20),
    target=st.text(max_size=20),
)
def test_names_outside_a_machine_are_refused(machine: str, source: str, target: str):
    m = MACHINES[machine]
    if source in m.states and target in m.states:
        return  # covered exhaustively above
    with pytest.raises(InvalidTransition):
        m.check(source, target)


def test_a_table_naming_an_unknown_state_or_repeating_an_edge_is_rejected():
    with pytest.raises(ValueError, match="unknown state"):
        Machine("m", ("a", "b"), (Edge("go", "a", "c"),))
    with pytest.raises(ValueError, match="duplicate edge"):
        Machine("m", ("a", "b"), (Edge("go", "a", "b"), Edge("again", "a", "b")))


def _reachable(machine: Machine, starts: set[str]) -> set[str]:
    seen, frontier = set(starts), list(starts)
    while frontier:
        for target in machine.targets(frontier.pop()):
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    return seen


def test_every_operation_status_is_reachable_and_only_settled_ones_can_be_dead_ends():
    # Proposals start pending, waiting for an approval, or waiting for a signal or timer.
    assert _reachable(OPERATION, {S.PENDING, S.WAITING_APPROVAL, S.WAITING}) == set(S.ALL)
    for status in S.ALL:
        if status not in S.FINAL:
            assert OPERATION.targets(status), f"{status} would strand an operation"


def test_a_terminal_task_never_moves_again():
    assert TASK.targets(C.TERMINAL) == set()
    assert TASK.sources_of(C.TERMINAL) == {C.RUNNABLE, C.RUNNING, C.WAITING}


# --- task_condition_for ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statuses", "condition"),
    [
        ([], C.RUNNABLE),
        ([S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATED], C.RUNNABLE),
        ([S.PENDING], C.RUNNABLE),
        ([S.RETRY_SCHEDULED, S.SUCCEEDED], C.RUNNABLE),
        ([S.WAITING_APPROVAL], C.WAITING),
        ([S.WAITING], C.WAITING),
        ([S.UNRESOLVED, S.SUCCEEDED], C.WAITING),
        ([S.MANUAL_INTERVENTION], C.WAITING),
        ([S.EXPIRED], C.WAITING),
        ([S.PENDING, S.WAITING_APPROVAL], C.RUNNABLE),
        ([S.RUNNING], C.RUNNING),
        ([S.COMPENSATING, S.UNRESOLVED], C.RUNNING),
        ([S.WAITING, S.PENDING, S.RUNNING, S.FAILED], C.RUNNING),
    ],
)
def test_task_condition_for_examples(statuses: list[str], condition: str):
    assert task_condition_for(statuses) == condition
    assert task_condition_for(iter(statuses)) == condition


statuses_lists = st.lists(st.sampled_from(S.ALL), max_size=12)


@given(statuses=statuses_lists, extra=st.sampled_from(S.ALL))
def test_task_condition_for_priorities(statuses: list[str], extra: str):
    condition = task_condition_for(statuses)
    assert condition in (C.RUNNABLE, C.RUNNING, C.WAITING)  # terminal is never derived
    # Order and repetition do not matter; settled operations never change the condition.
    assert task_condition_for(list(reversed(statuses)) + statuses) == condition
    assert task_condition_for([*statuses, S.SUCCEEDED, S.FAILED]) == condition
    # Running work wins over everything; waiting only when nothing can run or start.
    with_extra = task_condition_for([*statuses, extra])
    if condition == C.RUNNING or extra in S.ACTIVE:
        assert with_extra == C.RUNNING
    elif extra in S.CLAIMABLE:
        assert with_extra == C.RUNNABLE
    if condition == C.WAITING:
        assert not set(statuses) & (set(S.ACTIVE) | set(S.CLAIMABLE))


# --- status_deltas -----------------------------------------------------------------------

maybe_status = st.one_of(st.none(), st.sampled_from(S.ALL))


def _weight(status: str | None) -> tuple[int, int, int]:
    return status_deltas(None, status)


def _add(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def test_each_status_counts_in_at_most_one_category():
    assert status_deltas(None, None) == (0, 0, 0)
    for status in S.ALL:
        active, claimable, blocked = _weight(status)
        assert (active, claimable, blocked) == (
            int(status in S.ACTIVE),
            int(status in S.CLAIMABLE),
            int(status in S.BLOCKED),
        )
        assert active + claimable + blocked <= 1
        if status in S.FINAL:
            assert (active, claimable, blocked) == (0, 0, 0)
        assert status_deltas(status, None) == (-active, -claimable, -blocked)


@given(a=maybe_status, b=maybe_status, c=maybe_status)
def test_status_deltas_compose_along_a_path(a: str | None, b: str | None, c: str | None):
    assert status_deltas(a, a) == (0, 0, 0)
    assert status_deltas(a, b) == tuple(-x for x in status_deltas(b, a))
    assert _add(status_deltas(a, b), status_deltas(b, c)) == status_deltas(a, c)


# The oracle for the task's counters and condition, written out by hand from the rule and
# independent of the runtime's tables (S.ACTIVE, CONDITION_RULES...): a task runs while any of
# its operations runs, is runnable while one can be claimed, waits while one waits on something
# outside the workers (a person, a signal, a timer), and is otherwise runnable.
ORACLE_ACTIVE = {"running", "compensating"}
ORACLE_CLAIMABLE = {"pending", "retry_scheduled"}
ORACLE_BLOCKED = {"waiting_approval", "waiting", "unresolved", "manual_intervention", "expired"}


def oracle_counts_and_condition(statuses: list[str]) -> tuple[tuple[int, int, int], str]:
    counts = tuple(
        sum(1 for status in statuses if status in group)
        for group in (ORACLE_ACTIVE, ORACLE_CLAIMABLE, ORACLE_BLOCKED)
    )
    active, claimable, blocked = counts
    condition = (
        C.RUNNING if active else C.RUNNABLE if claimable else C.WAITING if blocked else C.RUNNABLE
    )
    return (active, claimable, blocked), condition


@pytest.mark.django_db
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    starts=st.lists(st.sampled_from(["tool", "gated", "wait"]), min_size=1, max_size=4),
    choices=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=30
    ),
)
def test_counters_kept_by_deltas_always_describe_the_operations(
    starts: list[str], choices: list[tuple[int, int]]
):
    """Walk a real task's operations along random edges of the table through the one writer of
    status (its journal statement applies only the deltas): after every move the task row's
    counters and condition equal a recount of the operations' statuses in the database by the
    oracle above, and never go negative."""
    from django.db import transaction
    from django.utils import timezone

    from runtime.models import Operation, Task
    from runtime.transitions.status import operation_transition_txn
    from tests import factories

    owner = factories.agent()
    task = factories.task(owner)
    proposals = {
        "tool": {"tool": "demo.echo"},
        "gated": {
            "tool": "demo.payments.charge",
            "params": {"account": "a", "amount_cents": 20000},
        },
        "wait": {"kind": "wait_signal", "tool": "", "signal": "s"},
    }
    ops = [factories.operation(owner, task, **proposals[start]).pk for start in starts]
    moves = 0

    def check() -> None:
        statuses = list(Operation.objects.filter(task=task).values_list("status", flat=True))
        row = Task.objects.get(pk=task.pk)
        counts, condition = oracle_counts_and_condition(statuses)
        assert (row.ops_active, row.ops_claimable, row.ops_blocked) == counts, statuses
        assert min(row.ops_active, row.ops_claimable, row.ops_blocked) >= 0
        assert row.condition == condition, (statuses, row.condition)

    check()
    for which, edge in choices:
        op = Operation.objects.get(pk=ops[which % len(ops)])
        targets = sorted(OPERATION.targets(op.status))
        if not targets:
            continue
        with transaction.atomic():
            operation_transition_txn(
                op, targets[edge % len(targets)], now=timezone.now(), actor="user:test"
            )
        moves += 1
        check()
    # The first choice always moves (no operation starts in a dead end): the walk did walk.
    assert moves >= 1


@pytest.mark.django_db
def test_the_rendered_condition_case_agrees_with_the_rule_on_the_database():
    """Run the journal statement's CASE itself (rendered from the rule list) on the database for
    every small multiset of statuses, against ``task_condition_for``."""
    import itertools

    from django.db import connection

    from runtime.events import condition_case_sql
    from runtime.transitions.status import status_deltas

    case = condition_case_sql()
    sql = (
        f"SELECT {case} FROM (SELECT %(c)s AS condition, 0 AS ops_active, "
        "0 AS ops_claimable, 0 AS ops_blocked) AS t"
    )
    for size in range(3):
        for statuses in itertools.combinations_with_replacement(S.ALL, size):
            counts = (0, 0, 0)
            for status in statuses:
                counts = _add(counts, status_deltas(None, status))
            with connection.cursor() as cur:
                cur.execute(
                    sql,
                    {
                        "c": "runnable",
                        "d_active": counts[0],
                        "d_claimable": counts[1],
                        "d_blocked": counts[2],
                    },
                )
                (derived,) = cur.fetchone()
            assert derived == task_condition_for(statuses), statuses
