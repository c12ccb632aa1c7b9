"""Cancellation races with work in flight: a task cancelled while its operation runs becomes
quiescent once that work is settled, whichever path settles it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from runtime.cancellation import task_cancel
from runtime.errors import InvalidTransition
from runtime.models import Execution, Operation, OutboxMessage, Task
from runtime.rules.statuses import Cancellation
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from runtime.transitions.status import task_transition_txn
from tests import factories

pytestmark = [pytest.mark.django_db]


def _running(owner):
    task = factories.task(owner)
    op = factories.operation(owner, task)
    worker = Execution.objects.create(host="test", pid=1).pk
    lease = operation_claim(op.pk, execution_id=worker)
    assert isinstance(lease, Lease)
    return task, op, worker


def test_cancel_waits_for_running_work_and_asks_it_to_stop():
    owner = factories.agent()
    task, op, _ = _running(owner)
    cancelled = task_cancel(owner.actor, task.pk, "stop")
    assert cancelled.cancellation == "acknowledged"  # not quiescent: work is still running
    assert cancelled.outcome is None
    assert Operation.objects.get(pk=op.pk).cancel_requested


def test_work_whose_worker_vanished_is_settled_and_the_task_becomes_quiescent():
    owner = factories.agent()
    task, op, worker = _running(owner)
    task_cancel(owner.actor, task.pk, "stop")
    # The worker goes silent; its lease expires and the redelivered work meets the cancel.
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=600)) == 1
    refusal = operation_claim(op.pk, execution_id=worker)
    assert isinstance(refusal, Refusal)
    assert Operation.objects.get(pk=op.pk).status == "cancelled"
    assert not OutboxMessage.objects.filter(operation_id=op.pk).exists()
    task = Task.objects.get(pk=task.pk)
    assert (task.cancellation, task.condition, task.outcome) == (
        "quiescent",
        "terminal",
        "cancelled",
    )


@pytest.mark.django_db
def test_the_task_writer_refuses_a_cancellation_move_the_table_lacks():
    """The task writer checks a change of ``cancellation`` against the CANCELLATION table (as it
    checks the condition against TASK): a task whose cancellation was never requested cannot be
    made quiescent, nor can an acknowledged one go back; nothing is written."""
    owner = factories.agent()
    task = factories.task(owner)
    version = task.state_version
    for source, target in (
        (Cancellation.NONE, Cancellation.QUIESCENT),
        (Cancellation.NONE, Cancellation.ACKNOWLEDGED),
    ):
        assert task.cancellation == source
        with pytest.raises(InvalidTransition), transaction.atomic():
            task_transition_txn(
                task,
                now=timezone.now(),
                actor="user:test",
                fields={"cancellation": target},
                event_type="task.cancel_acknowledged",
            )
    task.refresh_from_db()
    assert (task.cancellation, task.state_version) == (Cancellation.NONE, version)
    task_cancel(owner.actor, task.pk, reason="done with it")
    task.refresh_from_db()
    assert task.cancellation == Cancellation.QUIESCENT
    with pytest.raises(InvalidTransition), transaction.atomic():
        task_transition_txn(
            task,
            now=timezone.now(),
            actor="user:test",
            fields={"cancellation": Cancellation.REQUESTED},
            event_type="task.cancel_requested",
        )
    task.refresh_from_db()
    assert task.cancellation == Cancellation.QUIESCENT
