"""Support staff settle unresolved operations: guarded on state version, audited, allowed only
where the receiver's contract allows, never by an agent."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from runtime.models import Event, Invocation, Operation, OutboxMessage, Resolution
from runtime.sandbox import receivers
from tests import factories
from tests.concurrency import barrier_at

pytestmark: list[pytest.MarkDecorator] = []


def _unresolved(owner, tool="demo.notify", params=None, result=None) -> Operation:
    task = factories.task(owner)
    op = factories.operation(owner, task, tool=tool, params=params or {"to": "ops@example.com"})
    # As the recovery path leaves it: dispatched once, outcome never confirmed.
    Operation.objects.filter(pk=op.pk).update(
        status="unresolved", attempts_used=1, lease_generation=1, result=result
    )
    Invocation.objects.create(
        operation=op, number=1, lease_generation=1, started_at=op.created_at, outcome="lost"
    )
    op.refresh_from_db()
    return op


def _resolve(client: APIClient, op: Operation, resolution: str, evidence: str = "seen"):
    return client.post(
        f"/api/v1/operations/{op.pk}/resolve",
        {"resolution": resolution, "evidence": evidence, "state_version": op.state_version},
        format="json",
    )


@pytest.mark.django_db
def test_support_marks_succeeded_with_evidence_and_it_is_audited():
    owner, support = factories.agent(), factories.console_user("support")
    op = _unresolved(owner)
    response = _resolve(support.client(), op, "succeeded", "customer confirmed receipt")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "succeeded"
    audit = Resolution.objects.get(operation=op)
    assert (audit.resolution, audit.from_status, audit.to_status) == (
        "succeeded",
        "unresolved",
        "succeeded",
    )
    assert audit.actor == support.actor.label
    assert audit.evidence == "customer confirmed receipt"
    event = Event.objects.get(operation=op, type="operation.resolved_succeeded")
    assert event.actor == support.actor.label


@pytest.mark.django_db
def test_succeeded_needs_evidence_and_no_effect_fails_the_operation():
    owner, support = factories.agent(), factories.console_user("support")
    op = _unresolved(owner)
    assert _resolve(support.client(), op, "succeeded", "").status_code == 400
    response = _resolve(support.client(), op, "no_effect", "provider says nothing was sent")
    assert response.json()["status"] == "failed"
    assert response.json()["error"]["kind"] == "no_effect"


@pytest.mark.django_db
def test_an_agent_and_an_operator_cannot_resolve():
    owner = factories.agent()
    op = _unresolved(owner)
    assert _resolve(owner.client(), op, "no_effect").status_code == 403
    operator = factories.console_user("operator")
    refused = _resolve(operator.client(), op, "no_effect")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "not_authorized"
    op.refresh_from_db()
    assert op.status == "unresolved"


@pytest.mark.django_db
def test_retry_with_the_same_key_is_refused_without_a_receiver_contract():
    owner, support = factories.agent(), factories.console_user("support")
    op = _unresolved(owner)
    refused = _resolve(support.client(), op, "retry_same_key")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "resolution_not_allowed"
    assert Operation.objects.get(pk=op.pk).status == "unresolved"


@pytest.mark.django_db
def test_retry_with_the_same_key_requeues_a_replay_operation_under_its_key():
    owner, support = factories.agent(), factories.console_user("support")
    op = _unresolved(owner, tool="demo.payments.charge", params={"account": "a", "amount_cents": 5})
    response = _resolve(support.client(), op, "retry_same_key", "provider timed out")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "pending"
    assert body["idempotency_key"] == op.idempotency_key
    assert OutboxMessage.objects.filter(operation_id=op.pk).exists()


@pytest.mark.django_db
def test_lookup_resolution_records_what_the_receiver_says():
    owner, support = factories.agent(), factories.console_user("support")
    op = _unresolved(owner, tool="demo.inventory.reserve", params={"sku": "s", "qty": 1})
    receivers.inventory_reserve(key=op.idempotency_key, sku="s", qty=1, fencing_token=1)
    response = _resolve(support.client(), op, "lookup")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "succeeded"
    assert body["result"]["sku"] == "s"
    assert body["invocations"][-1]["receipt"]["via"] == "lookup"

    missing = _unresolved(owner, tool="demo.inventory.reserve", params={"sku": "t", "qty": 1})
    answer = _resolve(support.client(), missing, "lookup").json()
    assert answer["status"] == "failed"
    assert answer["error"]["kind"] == "no_effect"


@pytest.mark.django_db
def test_lookup_is_refused_where_the_receiver_cannot_be_asked():
    owner, support = factories.agent(), factories.console_user("support")
    op = _unresolved(owner)
    assert _resolve(support.client(), op, "lookup").json()["error"]["code"] == (
        "resolution_not_allowed"
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_support_staff_resolving_at_once_one_wins_the_other_gets_409():
    owner = factories.agent()
    first, second = factories.console_user("support"), factories.console_user("support")
    op = _unresolved(owner)
    answers: dict[str, tuple[int, dict]] = {}

    def resolve(name: str, who, resolution: str) -> None:
        try:
            client = who.client()
            response = _resolve(client, op, resolution, f"{name} checked")
            answers[name] = (response.status_code, response.json())
        finally:
            connection.close()

    threads = [
        threading.Thread(target=resolve, args=("a", first, "succeeded")),
        threading.Thread(target=resolve, args=("b", second, "no_effect")),
    ]
    # Both have read the operation at the same version before either takes its lock (the
    # barrier fails the test unless both reached it): the overlap is forced, not hoped for.
    with barrier_at("resolve.before_lock", 2):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    codes = sorted(code for code, _ in answers.values())
    assert codes == [200, 409], answers
    loser = next(body for code, body in answers.values() if code == 409)
    assert loser["error"]["code"] == "state_version_mismatch"
    assert Resolution.objects.filter(operation=op).count() == 1
    final = Operation.objects.get(pk=op.pk)
    winner = Resolution.objects.get(operation=op)
    assert final.status == winner.to_status


@pytest.mark.django_db
def test_the_unresolved_queue_lists_unresolved_operations():
    owner, support = factories.agent(), factories.console_user("support")
    op = _unresolved(owner)
    listed = support.client().get("/api/v1/operations?status=unresolved").json()["results"]
    assert [o["id"] for o in listed] == [op.pk]
