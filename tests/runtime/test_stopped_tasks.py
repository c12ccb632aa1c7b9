"""Nothing is admitted, claimed, retried or re-pended for a task whose stop was accepted (ended,
or cancellation requested), except its compensations; what might have taken effect stays with a
person instead of being repeated."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.cancellation import task_cancel, task_fail
from runtime.errors import TaskRefused
from runtime.executions import execution_for_agent
from runtime.models import Event, Operation, OutboxMessage
from runtime.resolutions import operation_resolve
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories

pytestmark = [pytest.mark.django_db]


def _running(owner, **spec) -> tuple[Operation, Lease]:
    task = factories.task(owner)
    op = factories.operation(owner, task, **spec)
    lease = operation_claim(op.pk, execution_id=execution_for_agent("worker").pk)
    assert isinstance(lease, Lease)
    return op, lease


def _report(op: Operation, lease: Lease, report: Report) -> Operation:
    return operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=report,
        execution_id=None,
    )


@pytest.mark.parametrize("stop", ["fail", "cancel"])
def test_work_told_to_stop_that_reports_a_transient_failure_is_not_retried(stop):
    owner = factories.agent()
    op, lease = _running(owner, params={"v": 1})
    (task_fail if stop == "fail" else task_cancel)(owner.actor, op.task_id, "give up")

    accepted = _report(op, lease, Report(outcome="failed", error_kind="transient", message="x"))
    assert accepted.status == "cancelled"
    assert not OutboxMessage.objects.filter(operation=op).exists()
    # A late duplicate delivery finds nothing to claim; no new generation is ever issued.
    refusal = operation_claim(op.pk, execution_id=execution_for_agent("w2").pk)
    assert isinstance(refusal, Refusal)
    op.refresh_from_db()
    assert op.lease_generation == 1
    assert op.task.condition == "terminal"


def test_an_unknown_outcome_on_a_stopped_task_goes_to_a_person_not_a_retry():
    owner = factories.agent()
    op, lease = _running(
        owner, tool="demo.payments.charge", params={"account": "a", "amount_cents": 5}
    )
    task_fail(owner.actor, op.task_id, "give up")
    accepted = _report(op, lease, Report(outcome="unknown", message="lost response"))
    assert accepted.status == "unresolved"


@pytest.mark.parametrize(
    ("tool", "params", "expected"),
    [
        ("demo.echo", {"v": 1}, "cancelled"),  # repeating it would be harmless: just stop
        ("demo.inventory.reserve", {"sku": "a", "qty": 1}, "unresolved"),
        ("demo.payments.charge", {"account": "a", "amount_cents": 5}, "unresolved"),
        ("demo.notify", {"to": "x"}, "unresolved"),
    ],
)
def test_an_expired_lease_of_a_stopped_task_is_never_pended_again(tool, params, expected):
    owner = factories.agent()
    op, _ = _running(owner, tool=tool, params=params)
    task_fail(owner.actor, op.task_id, "give up")
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=3600)) == 1
    op.refresh_from_db()
    assert op.status == expected
    assert not OutboxMessage.objects.filter(operation=op).exists()
    event = Event.objects.get(operation=op, type="operation.lease_expired")
    assert event.actor == "system:sweeper"


def test_retry_same_key_is_refused_on_a_stopped_task():
    owner, support = factories.agent(), factories.console_user("support")
    op, lease = _running(owner, tool="demo.inventory.reserve", params={"sku": "a", "qty": 1})
    task_fail(owner.actor, op.task_id, "give up")
    _report(op, lease, Report(outcome="unknown"))
    op.refresh_from_db()
    assert op.status == "unresolved"
    with pytest.raises(TaskRefused) as refused:
        operation_resolve(
            support.actor,
            op.pk,
            resolution="retry_same_key",
            evidence="try again",
            state_version=op.state_version,
        )
    assert refused.value.code == "task_terminal"
    op.refresh_from_db()
    assert op.status == "unresolved"
    # What a person may still do: ask the receiver, or settle it with evidence.
    settled = operation_resolve(
        support.actor, op.pk, resolution="lookup", evidence="", state_version=op.state_version
    )
    assert settled.status == "failed"  # the receiver has no record under the key


def test_a_claim_on_an_ended_task_settles_the_work_instead():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    # The task ended while this work sat in a queue (as after a lost race): the claim refuses.
    from runtime.models import Task

    Task.objects.filter(pk=task.pk).update(condition="terminal", outcome="failed")
    refusal = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "the task has ended"
    op.refresh_from_db()
    assert (op.status, op.lease_generation) == ("cancelled", 0)


@pytest.mark.parametrize(
    ("tool", "params", "expected"),
    [
        ("demo.notify", {"to": "x", "_fault": "error_after_effect"}, "unresolved"),
        ("demo.echo", {"v": 1, "_fault": "error_after_effect"}, "retry_scheduled"),
    ],
)
def test_an_unexpected_adapter_exception_is_an_unknown_outcome_not_a_failure(
    tool, params, expected
):
    from runtime.executor import operation_execute
    from runtime.sandbox.models import Notification

    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, tool=tool, params=params)
    assert operation_execute(op.pk) == "unknown"
    op.refresh_from_db()
    assert op.status == expected
    assert op.error["kind"] == "unknown"
    if tool == "demo.notify":
        # The effect did happen: "failed" would have been a lie.
        assert Notification.objects.filter(key=op.idempotency_key).count() == 1
