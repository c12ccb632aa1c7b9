"""What the contract names but the code does not honour yet is refused, never accepted and
dropped: fields answer 400 ``not_supported_yet`` naming the field, planned routes 501
``not_implemented`` (not 404), and nothing is written either way."""

from __future__ import annotations

import pytest

from runtime.models import Event, Operation, Task
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("budget", {"cost_cents": 100}),
        ("budget", {}),
        ("parent", "tsk_x"),
    ],
)
def test_task_fields_not_honoured_yet_are_refused_by_name(field, value):
    client = factories.agent().client()
    response = post_json(client, "/api/v1/tasks", {"name": "x", field: value})
    assert_error(response, 400, "not_supported_yet")
    assert response.json()["error"]["field"] == field
    assert field in response.json()["error"]["message"]
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("estimate", {"cost_cents": 5}), ("estimate", {})],
)
def test_operation_fields_not_honoured_yet_are_refused_by_name(field, value):
    alice = factories.agent()
    task = factories.task(alice)
    events = Event.objects.filter(task=task).count()
    response = post_json(
        alice.client(),
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "demo.echo", "step": "s", field: value},
    )
    assert_error(response, 400, "not_supported_yet")
    assert response.json()["error"]["field"] == field
    assert not Operation.objects.exists()
    assert Event.objects.filter(task=task).count() == events


def test_reported_usage_is_refused_until_budgets_settle_it():
    alice = factories.agent()
    op = factories.operation(alice, factories.task(alice), executor="agent")
    client = alice.client()
    claim = client.post(f"/api/v1/operations/{op.pk}/claim").json()
    response = post_json(
        client,
        f"/api/v1/operations/{op.pk}/complete",
        {
            "lease_generation": claim["lease_generation"],
            "lease_token": claim["lease_token"],
            "outcome": "succeeded",
            "usage": {"model_tokens": 10},
        },
    )
    assert_error(response, 400, "not_supported_yet")
    op.refresh_from_db()
    assert op.status == "running"


def test_null_means_absent_for_an_optional_field():
    client = factories.agent().client()
    response = post_json(client, "/api/v1/tasks", {"name": "x", "budget": None})
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/tasks/{task}/attempts"),
        ("get", "/api/v1/tasks/{task}/budget"),
    ],
)
def test_planned_routes_answer_501_not_404(method, path):
    alice = factories.agent()
    task = factories.task(alice)
    events = Event.objects.count()
    client = alice.client()
    url = path.format(task=task.pk)
    response = getattr(client, method)(url, {}, format="json")
    assert_error(response, 501, "not_implemented")
    # Anonymous callers are still told to authenticate first.
    from rest_framework.test import APIClient

    assert getattr(APIClient(), method)(url, {}, format="json").status_code == 401
    assert Event.objects.count() == events
