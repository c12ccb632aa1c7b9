"""Admins stop work from the task page: a CSRF-protected form calling the cancellation service;
other roles neither see nor can use it."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime.models import Operation, Task
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _browser(role: str, csrf: bool = False) -> Client:
    person = factories.console_user(role)
    client = Client(enforce_csrf_checks=csrf)
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client


def test_an_admin_cancels_a_task_from_its_page():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task)
    admin = _browser("admin")
    page = admin.get(f"/tasks/{task.pk}/").content.decode()
    assert "Cancel task" in page
    response = admin.post(f"/tasks/{task.pk}/cancel", {"reason": "customer withdrew"})
    assert response.status_code == 302
    task.refresh_from_db()
    assert (task.condition, task.outcome, task.cancellation) == (
        "terminal",
        "cancelled",
        "quiescent",
    )
    assert task.terminal_reason == "customer withdrew"
    assert Operation.objects.get(pk=op.pk).status == "cancelled"
    page = admin.get(f"/tasks/{task.pk}/").content.decode()
    assert "The task is cancelled: nothing of it runs any more." in page


def test_an_operator_has_no_cancel_button_and_is_refused():
    owner = factories.agent()
    task = factories.task(owner)
    operator = _browser("operator")
    assert "Cancel task" not in operator.get(f"/tasks/{task.pk}/").content.decode()
    assert operator.post(f"/tasks/{task.pk}/cancel", {"reason": "x"}).status_code == 403
    assert Task.objects.get(pk=task.pk).cancellation == "none"


def test_the_cancel_form_needs_its_csrf_token():
    owner = factories.agent()
    task = factories.task(owner)
    admin = _browser("admin", csrf=True)
    refused = admin.post(f"/tasks/{task.pk}/cancel", {"reason": "x"})
    # Nothing done; back to the task's page (with a message), not a bare refusal.
    assert (refused.status_code, refused["Location"]) == (303, f"/tasks/{task.pk}/")
    assert Task.objects.get(pk=task.pk).cancellation == "none"
