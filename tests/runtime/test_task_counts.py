"""The dashboard's counts come from counters the database keeps with every change of a task's
condition or outcome, whatever path made it: they always equal a recount, and reading them
never counts the task table."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runtime.cancellation import task_cancel, task_fail
from runtime.executions import execution_for_agent
from runtime.models import Task
from runtime.selectors.tasks import task_counts
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from tests import factories

pytestmark = pytest.mark.django_db


def _recount() -> dict[tuple[str, str | None], int]:
    return dict(Counter(Task.objects.values_list("condition", "outcome")))


def test_counters_follow_every_kind_of_change_and_equal_a_recount():
    owner = factories.agent()
    tasks = [factories.task(owner, name=f"t{n}") for n in range(5)]
    assert task_counts() == _recount() == {("runnable", None): 5}

    running = factories.operation(owner, tasks[0], params={"v": 1})
    lease = operation_claim(running.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    factories.operation(owner, tasks[1], executor="agent")
    task_cancel(owner.actor, tasks[2].pk, "no")
    task_fail(owner.actor, tasks[3].pk, "no")
    assert task_counts() == _recount()
    assert task_counts()[("running", None)] == 1

    operation_report(
        running.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="succeeded", result={}),
        execution_id=None,
        snapshot=lease.operation,
    )
    assert task_counts() == _recount()
    assert sum(task_counts().values()) == 5


def test_reading_the_counts_does_not_count_tasks():
    owner = factories.agent()
    factories.task(owner)
    with CaptureQueriesContext(connection) as ctx:
        task_counts()
    tables = [q["sql"] for q in ctx.captured_queries]
    assert tables and all('"runtime_task"' not in sql for sql in tables), tables


@pytest.mark.postgres
def test_concurrent_moves_never_wait_on_one_counter_row(transactional_db):
    """Two transactions moving two tasks the same way (each holding its counter rows until it
    commits) must not queue on one counter row: under load two such moves in opposite directions
    deadlocked (`make bench` met it). The tasks are chosen in one shard of the old scheme (by
    task id), where the second move waited for the first's commit."""
    owner = factories.agent()
    tasks = [factories.task(owner, name=f"t{n}").pk for n in range(17)]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, abs(hashtext(id)) %% 16 FROM runtime_task WHERE id = ANY(%s)", [tasks]
        )
        by_shard: dict[int, list[str]] = {}
        for task_id, shard in cur.fetchall():
            by_shard.setdefault(shard, []).append(task_id)
    first, second = next(ids for ids in by_shard.values() if len(ids) >= 2)[:2]

    params = connection.get_connection_params()
    opened = [connection.get_new_connection(params) for _ in range(3)]
    try:
        pids = [c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in opened]
        # Two backends that write different shards of the new scheme (of three, two differ).
        a, b = next(
            (opened[i], opened[j])
            for i in range(3)
            for j in range(i + 1, 3)
            if pids[i] % 64 != pids[j] % 64
        )
        a.execute("UPDATE runtime_task SET condition = 'waiting' WHERE id = %s", [first])
        b.execute("SET lock_timeout = '10s'")
        # Would wait for `a` to commit (and fail on the lock timeout) with one shared counter row.
        b.execute("UPDATE runtime_task SET condition = 'waiting' WHERE id = %s", [second])
        b.commit()
        a.commit()
    finally:
        for c in opened:
            c.close()
    assert task_counts() == _recount()
    assert task_counts()[("waiting", None)] == 2
