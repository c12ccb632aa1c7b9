"""A saga's compensation always runs in a stopped task (the task failed or was cancelled: that is
why it unwinds). The stop does not cover it (runtime.stoprule.stop_covers, the rule the claim
applies): its heartbeat does not answer "cancel" for the task's stop, the cancel watch does not
end it, and the worker process running it is not killed (issue 34, N2: it was ended
``unresolved``, its worker killed, and its original stayed ``compensating``)."""

from __future__ import annotations

import pytest

from runtime.cancellation import task_cancel, task_fail
from runtime.hashing import params_hash
from runtime.models import Event, Execution, Invocation, Operation, Task
from runtime.stopping import cancel_seen
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease, lease_heartbeat
from tests import factories
from tests.conftest import wait_for


def _claimed(op_id: str) -> Lease:
    lease = operation_claim(op_id, execution_id=Execution.objects.create(host="test", pid=1).pk)
    assert isinstance(lease, Lease), lease
    return lease


def _failed_with_a_refund_due(owner: factories.Principal) -> tuple[Task, Operation, Operation]:
    """A task that charged, then failed: its saga's refund is due, in the ended task."""
    task = factories.task(owner, compensate_on=["failed"])
    charge = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 5}
    )
    factories.run_claimable(task.pk)
    task_fail(owner.actor, task.pk, "gave up")
    refund = Operation.objects.get(compensates=charge)
    assert refund.status == "pending"
    return task, charge, refund


def _asked_to_stop(lease: Lease) -> tuple[bool, bool]:
    """(what the heartbeat answers, what the cancel watch sees) for the lease's call."""
    _, asked = lease_heartbeat(lease.operation_id, lease.lease_generation, lease.lease_token)
    return asked, cancel_seen(lease.operation_id, lease.lease_generation)


@pytest.mark.django_db
def test_a_stop_asks_covered_work_to_stop_but_not_a_compensation():
    owner = factories.agent()
    task, _, refund = _failed_with_a_refund_due(owner)
    assert Task.objects.get(pk=task.pk).condition == "terminal"
    compensation = _claimed(refund.pk)  # the claim already lets it run in the ended task
    assert _asked_to_stop(compensation) == (False, False)

    other = factories.task(owner)
    covered = _claimed(factories.operation(owner, other).pk)
    assert _asked_to_stop(covered) == (False, False)
    task_cancel(owner.actor, other.pk, "stop")
    assert _asked_to_stop(covered) == (True, True)
    # The task's stop alone is the answer, not only the flag the cancel set on the call.
    Operation.objects.filter(pk=covered.operation_id).update(cancel_requested=False)
    assert _asked_to_stop(covered) == (True, True)

    # A cancel of the compensation itself still stops it: only the task's stop passes it by.
    Operation.objects.filter(pk=compensation.operation_id).update(cancel_requested=True)
    assert _asked_to_stop(compensation) == (True, True)


@pytest.mark.workers
@pytest.mark.postgres
def test_a_long_compensation_in_an_ended_task_completes_on_a_real_worker(workers):
    """The refund heartbeats for three seconds (three heartbeats, a lease of 3 s) in a worker
    whose cancel watch would end a call asked to stop within half a second."""
    owner = factories.agent()
    task, charge, refund = _failed_with_a_refund_due(owner)
    # A compensation's parameters are made from its original's result: the demo knob that makes
    # a call take time (heartbeating its lease) is set on the row before any worker runs it.
    params = {**refund.params, "_work_seconds": 3}
    Operation.objects.filter(pk=refund.pk).update(params=params, params_hash=params_hash(params))

    (worker,) = workers.start(
        count=1, concurrency=1, LEASE_SECONDS=3, CANCEL_GRACE_SECONDS=0.5, OUTBOX_GRACE_SECONDS=2
    )
    processes = worker.children()
    wait_for(
        lambda: Operation.objects.get(pk=refund.pk).status in ("succeeded", "unresolved", "failed"),
        timeout=90,
        what=f"the refund to settle:\n{worker.tail()}",
    )
    refund.refresh_from_db()
    assert refund.status == "succeeded", (refund.status, refund.status_reason, refund.error)
    assert Operation.objects.get(pk=charge.pk).status == "compensated"
    assert Invocation.objects.filter(operation=refund).count() == 1  # never cut short
    assert not Event.objects.filter(operation=refund, type="operation.terminated").exists()
    assert worker.children() == processes  # no worker process was killed
    assert Task.objects.get(pk=task.pk).outcome == "failed"
