"""A worker's claim or report that the database rolled back for contention (a deadlock it broke,
a lock it would not wait for) is run again at once, not left for the sweeper to announce again
after its grace period; the retried acceptance happens exactly once. Both databases."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError

from runtime.crashpoints import crash_point_installed
from runtime.executor import operation_execute
from runtime.models import Event, Invocation, Operation
from tests import factories


def _deadlock_once(raised: list[int]):
    def action() -> None:
        if not raised:
            raised.append(1)
            # What Django raises when PostgreSQL breaks a deadlock: the driver's error as cause.
            cause = psycopg.errors.DeadlockDetected("deadlock detected")
            raise OperationalError("deadlock detected") from cause

    return action


@pytest.mark.django_db(transaction=True)
def test_a_report_rolled_back_by_a_deadlock_is_retried_and_accepted_once():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    raised: list[int] = []
    with crash_point_installed("report.before_commit", _deadlock_once(raised)):
        assert operation_execute(op.pk) == "succeeded"
    assert raised, "the acceptance never met the deadlock"
    op = Operation.objects.get(pk=op.pk)
    assert (op.status, op.result, op.lease_generation) == ("succeeded", {"v": 1}, 1)
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
    assert Invocation.objects.filter(operation=op).count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_error_that_is_not_contention_is_not_retried():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise OperationalError("server closed the connection unexpectedly")

    with crash_point_installed("report.before_commit", broken), pytest.raises(OperationalError):
        operation_execute(op.pk)
    assert len(calls) == 1
    assert Operation.objects.get(pk=op.pk).status == "running"  # the sweeper's to take back
