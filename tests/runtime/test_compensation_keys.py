"""Compensation keys are unique per logical compensation: two compensable effects of one step
both unwind, and an effect compensated a second time (the first compensation had no effect)
gets a new key instead of colliding inside an acceptance transaction."""

from __future__ import annotations

import pytest

from runtime.cancellation import task_fail
from runtime.executions import execution_for_agent
from runtime.models import Operation
from runtime.resolutions import operation_resolve
from runtime.sandbox.models import Charge
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from tests import factories
from tests.factories import run_claimable

pytestmark = [pytest.mark.django_db]


def test_two_compensable_effects_of_one_step_both_unwind():
    owner = factories.agent()
    task = factories.task(owner, compensate_on=["failed"])
    charges = [
        factories.operation(
            owner,
            task,
            step="pay",
            tool="demo.payments.charge",
            idempotency_key=f"order-7-part-{n}",
            params={"account": "acct", "amount_cents": 100 + n},
        )
        for n in (1, 2)
    ]
    run_claimable(task.pk)
    assert {Operation.objects.get(pk=c.pk).status for c in charges} == {"succeeded"}

    task_fail(owner.actor, task.pk, "the order was abandoned")
    run_claimable(task.pk)

    for charge in charges:
        assert Operation.objects.get(pk=charge.pk).status == "compensated"
    compensations = Operation.objects.filter(task=task, compensates__isnull=False)
    assert compensations.count() == 2
    assert len({c.idempotency_key for c in compensations}) == 2
    assert {c.status for c in compensations} == {"succeeded"}
    refunds = Charge.objects.filter(kind="refund")
    assert sorted(r.amount_cents for r in refunds) == [-102, -101]


def test_a_second_compensation_after_a_no_effect_resolution_gets_its_own_key():
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    original = factories.operation(
        owner, task, tool="demo.inventory.reserve", params={"sku": "a", "qty": 1}
    )
    run_claimable(task.pk)
    original.refresh_from_db()
    assert original.status == "succeeded"
    # Support decides to undo it.
    Operation.objects.filter(pk=original.pk).update(status="unresolved")
    task_counts_fix(task.pk)
    original.refresh_from_db()
    operation_resolve(
        support.actor, original.pk, resolution="compensate", evidence="undo",
        state_version=original.state_version,
    )  # fmt: skip
    first = Operation.objects.get(compensates=original)
    # The release fails for good: a compensation that cannot finish goes to a person.
    lease = operation_claim(first.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    operation_report(
        first.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="failed", error_kind="permanent", message="release refused"),
        execution_id=None,
    )
    first.refresh_from_db()
    assert first.status == "unresolved"
    operation_resolve(
        support.actor, first.pk, resolution="no_effect", evidence="nothing was released",
        state_version=first.state_version,
    )  # fmt: skip
    original.refresh_from_db()
    assert original.status == "unresolved"

    operation_resolve(
        support.actor, original.pk, resolution="compensate", evidence="try the undo again",
        state_version=original.state_version,
    )  # fmt: skip
    second = Operation.objects.filter(compensates=original).exclude(pk=first.pk).get()
    assert second.idempotency_key != first.idempotency_key
    assert second.idempotency_key.endswith(":v2")
    run_claimable(task.pk)
    second.refresh_from_db()
    original.refresh_from_db()
    assert (second.status, original.status) == ("succeeded", "compensated")


def task_counts_fix(task_id: str) -> None:
    """Keep the task's blocked counter in step with the hand-set status above."""
    from django.db.models import F

    from runtime.models import Task

    Task.objects.filter(pk=task_id).update(ops_blocked=F("ops_blocked") + 1)
