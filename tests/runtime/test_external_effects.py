"""The most dangerous window, with real worker processes: the receiver commits, then the worker
dies (or the response is lost). Recovery follows the receiver's contract: replay and lookup end
succeeded with exactly one effect; with no contract the operation goes to a person, unresolved,
with one effect and no second invocation."""

from __future__ import annotations

import pytest

from runtime.models import Event, Invocation, Operation
from runtime.sandbox.receivers import effects_under
from tests import factories
from tests.conftest import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {
    "LEASE_SECONDS": 3,
    "SWEEP_SECONDS": 1,
    "OUTBOX_GRACE_SECONDS": 2,
    "RETRY_BASE_SECONDS": 0.2,
}

CASES = {
    "replay": ("demo.payments.charge", "payments", {"account": "acct_9", "amount_cents": 1200}),
    "lookup": ("demo.inventory.reserve", "inventory", {"sku": "sku-9", "qty": 3}),
    "none": ("demo.notify", "notify", {"to": "ops@example.com", "message": "hi"}),
}
FINAL = ("succeeded", "unresolved", "failed")


def test_recovery_follows_each_receivers_contract(workers):
    workers.start(count=1, concurrency=2, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    ops: dict[tuple[str, str], Operation] = {}
    for fault in ("crash_after_effect", "unknown"):
        for contract, (tool, _, params) in CASES.items():
            task = factories.task(owner, name=f"{contract} {fault}")
            ops[(contract, fault)] = factories.operation(
                owner, task, tool=tool, params={**params, "_fault": fault}
            )

    wait_for(
        lambda: all(Operation.objects.get(pk=op.pk).status in FINAL for op in ops.values()),
        timeout=120,
        what="every operation to settle",
    )
    for (contract, fault), op in ops.items():
        op.refresh_from_db()
        _, receiver, params = CASES[contract]
        effects = effects_under(receiver, op.idempotency_key)
        invocations = list(Invocation.objects.filter(operation=op).order_by("number"))
        where = f"{contract}/{fault}: {op.status} {[i.outcome for i in invocations]}"
        assert len(effects) == 1, where  # exactly one effect at the receiver, in every case
        if contract == "none":
            assert op.status == "unresolved", where
            assert len(invocations) == 1, where  # never invoked again by a machine
            assert invocations[0].outcome in ("lost", "unknown"), where
        else:
            assert op.status == "succeeded", where
            assert len(invocations) == 2, where
            assert invocations[0].outcome in ("lost", "unknown"), where
            if contract == "replay":
                assert op.result["id"] == effects[0]["id"], where
                assert op.result["amount_cents"] == params["amount_cents"]
            else:
                assert op.result["id"] == effects[0]["id"], where
                assert invocations[1].receipt["via"] == "lookup", where
        assert Event.objects.filter(operation=op, type="operation.succeeded").count() <= 1


def test_cancelled_task_compensates_its_effects_newest_first(workers):
    workers.start(count=1, concurrency=2, **FAST)
    owner = factories.agent()
    task = factories.task(owner, compensate_on=["cancelled"])
    charge = factories.operation(
        owner, task, step="charge", tool="demo.payments.charge",
        params={"account": "acct_c", "amount_cents": 700},
    )  # fmt: skip
    wait_for(lambda: Operation.objects.get(pk=charge.pk).status == "succeeded", timeout=60)
    hold = factories.operation(
        owner, task, step="hold", tool="demo.inventory.reserve", params={"sku": "x", "qty": 1}
    )
    wait_for(lambda: Operation.objects.get(pk=hold.pk).status == "succeeded", timeout=60)

    response = owner.client().post(f"/api/v1/tasks/{task.pk}/cancel", {"reason": "user quit"})
    assert response.status_code == 202
    assert response.json()["cancellation"] == "quiescent"
    assert response.json()["outcome"] == "cancelled"

    wait_for(
        lambda: Operation.objects.get(pk=charge.pk).status == "compensated",
        timeout=90,
        what="both compensations",
    )
    assert Operation.objects.get(pk=hold.pk).status == "compensated"
    compensations = list(
        Operation.objects.filter(task=task, compensates__isnull=False).order_by("created_at")
    )
    # Reverse order of completion: the inventory hold first, then the charge.
    assert [c.compensates_id for c in compensations] == [hold.pk, charge.pk]
    assert all(c.status == "succeeded" for c in compensations)
    assert compensations[1].idempotency_key.endswith(
        ":charge:demo.payments.charge:v1:compensate:demo.payments.refund:v1"
    )
    refunds = effects_under("payments", compensations[1].idempotency_key)
    assert len(refunds) == 1 and refunds[0]["kind"] == "refund"
    # History is kept: the originals' success is still in the journal.
    assert Event.objects.filter(operation=charge, type="operation.succeeded").count() == 1


def test_a_failing_compensation_ends_unresolved_not_lost(workers):
    workers.start(count=1, concurrency=1, **FAST)
    owner = factories.agent()
    task = factories.task(owner, compensate_on=["failed"])
    charge = factories.operation(
        owner, task, step="charge", tool="demo.payments.charge",
        params={"account": "acct_f", "amount_cents": 300},
    )  # fmt: skip
    wait_for(lambda: Operation.objects.get(pk=charge.pk).status == "succeeded", timeout=60)
    # The charge vanished on the provider's side: the refund cannot succeed.
    from runtime.sandbox.models import Charge

    Charge.objects.filter(key=charge.idempotency_key).delete()

    response = owner.client().post(f"/api/v1/tasks/{task.pk}/fail", {"reason": "gave up"})
    assert response.status_code == 202
    assert response.json()["outcome"] == "failed"
    compensation = wait_for(
        lambda: Operation.objects.filter(compensates=charge, status="unresolved").first(),
        timeout=60,
        what="the compensation to go to a person",
    )
    assert Operation.objects.get(pk=charge.pk).status == "compensating"
    assert compensation.error["kind"] == "permanent"

    support = factories.console_user("support")
    resolved = support.client().post(
        f"/api/v1/operations/{compensation.pk}/resolve",
        {
            "resolution": "succeeded",
            "evidence": "refunded by hand",
            "state_version": compensation.state_version,
        },
        format="json",
    )
    assert resolved.status_code == 200
    assert Operation.objects.get(pk=charge.pk).status == "compensated"
