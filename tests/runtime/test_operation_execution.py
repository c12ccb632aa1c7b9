"""The path with real Celery worker processes on PostgreSQL: every operation accepted exactly
once, duplicate deliveries harmless, a stale acceptance rejected and recorded."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.errors import StaleLease
from runtime.models import Event, Execution, Invocation, Operation, RejectedObservation
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease, lease_expire_sweep
from runtime.worker import execute_operation
from tests import factories
from tests.conftest import broker_idle, wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]


def test_racing_workers_accept_each_operation_once_despite_duplicate_deliveries(workers):
    workers.start(count=3, concurrency=2)
    owner = factories.agent()
    task = factories.task(owner)
    ops = [factories.operation(owner, task, params={"n": i}) for i in range(40)]
    # Every message delivered three more times, as a redelivering broker would.
    for op in ops:
        for _ in range(3):
            execute_operation.apply_async(args=(op.pk, None))

    wait_for(
        lambda: Operation.objects.filter(task=task, status="succeeded").count() == len(ops),
        timeout=90,
        what="all operations to succeed",
    )
    # The duplicates may still be queued when the last acceptance commits: assert only once
    # every delivery has run and been acknowledged. Of each operation's three duplicates at most
    # one can have claimed it, so at least two were refused (and recorded).
    wait_for(broker_idle, timeout=90, what="every duplicate delivery to be consumed")
    refused = Counter(
        RejectedObservation.objects.filter(operation__task=task, kind="refused_claim").values_list(
            "operation_id", flat=True
        )
    )
    assert all(refused[op.pk] >= 2 for op in ops), refused
    for op in Operation.objects.filter(task=task):
        assert op.result == {"n": op.params["n"]}
        assert op.lease_generation == 1
        assert op.attempts_used == 1
        assert Invocation.objects.filter(operation=op).count() == 1
        assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
    # The work was spread over several processes, and the journal stayed gap-free.
    executions = set(
        Invocation.objects.filter(operation__task=task).values_list("execution", flat=True)
    )
    assert len(executions) > 1
    seqs = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    task.refresh_from_db()
    assert task.condition == "runnable"
    assert (task.ops_active, task.ops_claimable, task.ops_blocked) == (0, 0, 0)


def test_stale_acceptance_after_takeover_is_rejected_and_recorded(workers):
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"x": 1})
    # An old owner (this process) claims generation 1, then stalls past its lease.
    stalled = Execution.objects.create(host="stalled-worker", pid=0).pk
    old = operation_claim(op.pk, execution_id=stalled)
    assert isinstance(old, Lease) and old.lease_generation == 1
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=120)) == 1

    workers.start(count=2, concurrency=1)
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="the new generation to finish",
    )
    op.refresh_from_db()
    assert op.lease_generation == 2

    with pytest.raises(StaleLease):
        operation_report(
            op.pk,
            lease_generation=old.lease_generation,
            lease_token=old.lease_token,
            state_version=old.state_version,
            report=Report(outcome="succeeded", result={"late": True}),
            execution_id=None,
        )
    op.refresh_from_db()
    assert op.result == {"x": 1}
    assert op.status == "succeeded"
    rejected = RejectedObservation.objects.get(operation=op, kind="stale_completion")
    assert rejected.lease_generation == 1
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
    lost = Invocation.objects.get(operation=op, lease_generation=1)
    assert lost.outcome == Invocation.OUTCOME_LOST
