"""Receivers that take a fencing token (the demo payments and inventory receivers) refuse a token
older than the newest they have seen for the key. The window it closes: a worker that stalls
*before* its effect, wakes after its lease was taken over and the new holder looked up and acted,
and would otherwise add a second reservation under a ``lookup`` receiver."""

from __future__ import annotations

import pytest

from runtime.models import Invocation, Operation, RejectedObservation
from runtime.sandbox import receivers
from runtime.sandbox.models import Charge, Reservation
from tests import factories
from tests.conftest import wait_for

FAST = {
    "LEASE_SECONDS": 2,
    "SWEEP_SECONDS": 1,
    "OUTBOX_GRACE_SECONDS": 1,
    "RETRY_BASE_SECONDS": 0.2,
}


@pytest.mark.django_db
def test_inventory_refuses_an_older_token_once_a_newer_one_acted():
    fresh = receivers.inventory_reserve(key="k", sku="s", qty=1, fencing_token=2)
    assert fresh.status == 200
    stale = receivers.inventory_reserve(key="k", sku="s", qty=1, fencing_token=1)
    assert stale.status == 409
    assert stale.body["error"]["type"] == "stale_fencing_token"
    assert Reservation.objects.filter(key="k").count() == 1
    # The same holder may act again (its own retry); a newer one always may.
    assert receivers.inventory_reserve(key="k", sku="s", qty=1, fencing_token=2).ok
    assert receivers.inventory_reserve(key="k", sku="s", qty=1, fencing_token=3).ok


@pytest.mark.django_db
def test_a_lookup_by_the_new_holder_fences_out_the_old_one():
    assert receivers.inventory_lookup(key="k", fencing_token=5).status == 404
    assert receivers.inventory_reserve(key="k", sku="s", qty=1, fencing_token=4).status == 409
    assert not Reservation.objects.filter(key="k").exists()


@pytest.mark.django_db
def test_payments_refuse_an_older_token_before_touching_the_idempotency_record():
    body = {"account": "a", "amount_cents": 10}
    assert receivers.payments_charge(key="p", body=body, fencing_token=3).status == 200
    stale = receivers.payments_charge(key="p", body=body, fencing_token=2)
    assert stale.status == 409
    assert stale.body["error"]["type"] == "stale_fencing_token"
    assert Charge.objects.filter(key="p").count() == 1
    # The current holder still gets the stored first result (Stripe's replay).
    again = receivers.payments_charge(key="p", body=body, fencing_token=3)
    assert again.status == 200 and again.body["id"] == Charge.objects.get(key="p").charge_id


@pytest.mark.workers
@pytest.mark.postgres
def test_a_worker_stalled_before_its_effect_adds_no_second_reservation(workers):
    workers.start(count=1, concurrency=2, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(
        owner,
        task,
        tool="demo.inventory.reserve",
        params={"sku": "sku-9", "qty": 1, "_fault": "stall_before_effect"},
    )
    # Generation 1 stalls before the receiver; the sweeper hands the work to generation 2,
    # which asks the receiver (nothing there yet), reserves, and succeeds.
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=90,
        what="the new holder to finish",
    )
    # Generation 1 then wakes, reaches the receiver with its old token, and is refused; its
    # late report is refused by the runtime too.
    wait_for(
        lambda: RejectedObservation.objects.filter(
            operation=op, kind="stale_completion", lease_generation=1
        ).exists(),
        timeout=60,
        what="the stalled worker's late report",
    )
    assert Reservation.objects.filter(key=op.idempotency_key).count() == 1
    op.refresh_from_db()
    assert op.lease_generation == 2
    first = Invocation.objects.get(operation=op, number=1)
    assert first.outcome == Invocation.OUTCOME_LOST
