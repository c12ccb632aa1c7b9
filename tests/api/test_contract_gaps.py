"""What the contract names but the code does not honour yet is refused, never accepted and
dropped: fields answer 400 ``not_supported_yet`` naming the field, planned routes 501
``not_implemented`` (not 404), and nothing is written either way."""

from __future__ import annotations

import pytest

from runtime.models import Event, Operation
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("field", "value"), [("approval_timeout_seconds", 60)])
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


def test_null_means_absent_for_an_optional_field():
    client = factories.agent().client()
    response = post_json(client, "/api/v1/tasks", {"name": "x", "budget": None})
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/tasks/{task}/signals"),
        ("post", "/api/v1/tasks/{task}/pause"),
        ("post", "/api/v1/tasks/{task}/resume"),
        ("post", "/api/v1/tasks/{task}/steer"),
        ("get", "/api/v1/approvals"),
        ("post", "/api/v1/approvals/decisions"),
        ("post", "/api/v1/approvals/apr_1/decision"),
        ("post", "/api/v1/approvals/apr_1/renew"),
        ("post", "/api/v1/approvals/apr_1/edit"),
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
