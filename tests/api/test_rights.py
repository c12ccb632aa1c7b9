"""Who may *do* what (runtime/policy.py), seen from the API: proposing is the task's owner's
right, claiming an agent-run operation is the task's agent's, and idempotency keys live in their
owner's namespace at the receivers."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runtime.models import Event, Invocation, Operation
from runtime.sandbox import receivers
from runtime.sandbox.models import Charge, PaymentRequest
from tests import factories
from tests.api.support import assert_error, post_json

# Both databases: embedded (SQLite, rate limits counted in the database) and services.
pytestmark = [pytest.mark.django_db]

CHARGE = {
    "tool": "demo.payments.charge",
    "step": "pay",
    "params": {"account": "a", "amount_cents": 5},
}


def _snapshot(task) -> tuple[int, int, int]:
    return (
        Operation.objects.filter(task=task).count(),
        Event.objects.filter(task=task).count(),
        Invocation.objects.filter(operation__task=task).count(),
    )


def _session(role: str) -> APIClient:
    person = factories.console_user(role)
    client = APIClient(enforce_csrf_checks=False)
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client


@pytest.mark.parametrize("role", ["operator", "support", "admin"])
def test_console_users_cannot_propose_into_an_agents_task(role):
    agent = factories.agent()
    task = factories.task(agent)
    before = _snapshot(task)
    for client in (factories.console_user(role).client(), _session(role)):
        response = post_json(client, f"/api/v1/tasks/{task.pk}/operations", CHARGE)
        assert_error(response, 403, "not_authorized")
    assert _snapshot(task) == before
    # The task's agent still may.
    assert (
        post_json(agent.client(), f"/api/v1/tasks/{task.pk}/operations", CHARGE).status_code == 201
    )


def test_a_user_proposes_into_the_tasks_it_created_only():
    operator = factories.console_user("operator")
    client = operator.client()
    mine = post_json(client, "/api/v1/tasks", {"name": "mine"}).json()["id"]
    created = post_json(client, f"/api/v1/tasks/{mine}/operations", CHARGE)
    assert created.status_code == 201, created.content
    # Its keys live in the user's namespace, not any agent's.
    assert created.json()["idempotency_key"].startswith(f"usr_{operator.actor.user_id}/")


@pytest.mark.parametrize("role", ["operator", "support", "admin"])
def test_console_users_cannot_claim_or_complete_an_agents_operation(role):
    agent = factories.agent()
    task = factories.task(agent)
    op = factories.operation(agent, task, executor="agent")
    client = factories.console_user(role).client()
    before = _snapshot(task)
    assert_error(client.post(f"/api/v1/operations/{op.pk}/claim"), 403, "not_authorized")
    # Even while the agent holds the lease, nobody else may complete it.
    lease = agent.client().post(f"/api/v1/operations/{op.pk}/claim").json()
    token = lease["lease_token"]  # even with the claim's own secret
    during = _snapshot(task)
    assert during != before
    for path, body in [
        ("heartbeat", {"lease_generation": lease["lease_generation"], "lease_token": token}),
        (
            "complete",
            {
                "lease_generation": lease["lease_generation"],
                "lease_token": token,
                "outcome": "succeeded",
            },
        ),
    ]:
        response = post_json(client, f"/api/v1/operations/{op.pk}/{path}", body)
        assert_error(response, 403, "not_authorized")
    assert _snapshot(task) == during
    assert Operation.objects.get(pk=op.pk).status == "running"
    # The claim is credited to the agent by name in the journal.
    claimed = Event.objects.get(operation=op, type="operation.claimed")
    assert claimed.actor == agent.actor.label


def test_keys_are_namespaced_so_one_agent_cannot_squat_anothers():
    alice, bob = factories.agent(), factories.agent()
    a_task, b_task = factories.task(alice), factories.task(bob)
    body = {**CHARGE, "idempotency_key": "order-1"}
    a_op = post_json(alice.client(), f"/api/v1/tasks/{a_task.pk}/operations", body).json()
    b_op = post_json(bob.client(), f"/api/v1/tasks/{b_task.pk}/operations", body).json()
    assert a_op["idempotency_key"] == f"{alice.actor.agent_id}/order-1"
    assert b_op["idempotency_key"] == f"{bob.actor.agent_id}/order-1"
    # Alice's charge under "order-1" does not make Bob's fail as "key reused".
    assert receivers.payments_charge(
        key=a_op["idempotency_key"], body={"account": "a", "amount_cents": 9}, fencing_token=1
    ).ok
    assert receivers.payments_charge(
        key=b_op["idempotency_key"], body={"account": "a", "amount_cents": 5}, fencing_token=1
    ).ok


def test_a_key_inside_another_owners_namespace_is_refused():
    alice, bob = factories.agent(), factories.agent()
    a_task, b_task = factories.task(alice), factories.task(bob)
    b_op = factories.operation(bob, b_task, tool="demo.payments.charge", params=CHARGE["params"])
    before = _snapshot(a_task)
    response = post_json(
        alice.client(),
        f"/api/v1/tasks/{a_task.pk}/operations",
        {**CHARGE, "idempotency_key": b_op.idempotency_key},
    )
    assert_error(response, 403, "key_outside_namespace")
    assert _snapshot(a_task) == before


def test_the_effects_view_authorises_through_the_operation_owning_the_key():
    alice, bob = factories.agent(), factories.agent()
    b_task = factories.task(bob)
    b_op = factories.operation(bob, b_task, tool="demo.payments.charge", params=CHARGE["params"])
    receivers.payments_charge(key=b_op.idempotency_key, body=CHARGE["params"], fencing_token=1)
    url = "/api/v1/demo/receivers/payments/effects"
    assert_error(alice.client().get(url, {"key": b_op.idempotency_key}), 404, "not_found")
    # The bare key Bob chose or derived, without its namespace, is no way in either.
    bare = b_op.idempotency_key.split("/", 1)[1]
    assert_error(alice.client().get(url, {"key": bare}), 404, "not_found")
    # A key no operation owns is 404 even for staff.
    support = factories.console_user("support").client()
    assert_error(support.get(url, {"key": "agt_x/made-up"}), 404, "not_found")
    assert len(bob.client().get(url, {"key": b_op.idempotency_key}).json()["effects"]) == 1
    assert len(support.get(url, {"key": b_op.idempotency_key}).json()["effects"]) == 1


def test_a_refund_from_one_owners_namespace_cannot_touch_anothers_charge():
    alice, bob = factories.agent(), factories.agent()
    b_op = factories.operation(
        bob, factories.task(bob), tool="demo.payments.charge", params=CHARGE["params"]
    )
    charged = receivers.payments_charge(
        key=b_op.idempotency_key, body=CHARGE["params"], fencing_token=1
    )
    charge_id = charged.body["id"]
    a_refund = factories.operation(
        alice, factories.task(alice), tool="demo.payments.refund", params={"charge": charge_id}
    )
    refused = receivers.payments_refund(
        key=a_refund.idempotency_key, charge_id=charge_id, fencing_token=1
    )
    assert refused.status == 404
    assert not Charge.objects.filter(kind="refund").exists()
    # Bob's own refund works (and was not blocked by Alice's attempt).
    b_refund = factories.operation(
        bob, b_op.task, tool="demo.payments.refund", params={"charge": charge_id}
    )
    assert receivers.payments_refund(
        key=b_refund.idempotency_key, charge_id=charge_id, fencing_token=1
    ).ok
    assert PaymentRequest.objects.filter(key=b_refund.idempotency_key).exists()
