"""Two people resolving one unresolved operation at once by asking its receiver: both ask (no
transaction is open while they do), both then try to settle; one wins with 200, the other gets
409 ``state_version_mismatch``, and exactly one lookup invocation is recorded."""

from __future__ import annotations

import pytest

from runtime.models import Invocation, Operation, Resolution
from runtime.sandbox import receivers
from tests import factories
from tests.concurrency import barrier_at, in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _unresolved_reservation(owner) -> Operation:
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.inventory.reserve", params={"sku": "sku-1", "qty": 2}
    )
    Operation.objects.filter(pk=op.pk).update(
        status="unresolved", attempts_used=1, lease_generation=1
    )
    Invocation.objects.create(
        operation=op, number=1, lease_generation=1, started_at=op.created_at, outcome="lost"
    )
    # The effect did happen at the receiver; only its answer was lost.
    receivers.inventory_reserve(key=op.idempotency_key, sku="sku-1", qty=2, fencing_token=1)
    op.refresh_from_db()
    return op


def test_concurrent_lookup_resolutions_give_one_200_and_one_409():
    owner = factories.agent()
    people = [factories.console_user("support"), factories.console_user("support")]
    op = _unresolved_reservation(owner)

    def resolve(person) -> tuple[int, str]:
        response = person.client().post(
            f"/api/v1/operations/{op.pk}/resolve",
            {"resolution": "lookup", "evidence": "", "state_version": op.state_version},
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"resolve-{person.actor.name}",
        )
        body = response.json()
        code = body["error"]["code"] if response.status_code >= 400 else ""
        return response.status_code, code

    # Both have asked the receiver before either settles.
    with barrier_at("resolve.after_lookup", 2):
        racers = [in_thread(lambda p=p: resolve(p), f"support-{n}") for n, p in enumerate(people)]
        for thread, _ in racers:
            thread.join(30)
    results = sorted(f.result(timeout=1) for _, f in racers)
    assert results == [(200, ""), (409, "state_version_mismatch")]
    op.refresh_from_db()
    assert op.status == "succeeded"
    assert Invocation.objects.filter(operation=op, number=2).count() == 1
    assert Resolution.objects.filter(operation=op).count() == 1
