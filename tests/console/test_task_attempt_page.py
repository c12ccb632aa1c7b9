"""A new attempt from the task's page (issue 39): admins get a button with a reason and a
confirmation, calling the attempts service; others neither see it nor can use it; a task that no
longer admits work gets no button and a refusal that changes nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime.control import task_pause
from runtime.models import Attempt, Task
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _browser(role: str) -> Client:
    person = factories.console_user(role)
    client = Client()
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client


def test_an_admin_starts_a_new_attempt_from_the_task_page():
    owner = factories.agent()
    task = factories.task(owner, "retry me", budget={"tool_calls": 5})
    factories.operation(owner, task, executor="agent")
    admin = _browser("admin")
    page = admin.get(f"/tasks/{task.pk}/").content.decode()
    assert "Start a new attempt" in page and "Start attempt #2 of" in page
    response = admin.post(f"/tasks/{task.pk}/attempt", {"reason": "the model was stuck"})
    assert (response.status_code, response["Location"]) == (302, f"/tasks/{task.pk}/")
    task.refresh_from_db()
    assert task.current_attempt.number == 2
    first = Attempt.objects.get(task=task, number=1)
    assert first.ended_at is not None and first.outcome
    assert Attempt.objects.get(task=task, number=2).reason == "the model was stuck"
    page = admin.get(f"/tasks/{task.pk}/").content.decode()
    assert "Attempt #2 started" in page
    assert "Start attempt #3 of" in page


@pytest.mark.parametrize("role", ["operator", "support"])
def test_others_have_no_button_and_are_refused(role):
    owner = factories.agent()
    task = factories.task(owner)
    person = _browser(role)
    assert "Start a new attempt" not in person.get(f"/tasks/{task.pk}/").content.decode()
    assert person.post(f"/tasks/{task.pk}/attempt", {"reason": "x"}).status_code == 403
    assert Task.objects.get(pk=task.pk).current_attempt.number == 1


def test_a_paused_task_has_no_button_and_a_refused_post_changes_nothing():
    owner = factories.agent()
    task = factories.task(owner)
    admin_user = factories.console_user("admin")
    task_pause(admin_user.actor, task.pk, reason="hold on")
    admin = Client()
    assert admin.login(username=admin_user.actor.name, password=factories.PASSWORD)
    assert "Start a new attempt" not in admin.get(f"/tasks/{task.pk}/").content.decode()
    refused = admin.post(f"/tasks/{task.pk}/attempt", {"reason": "x"})
    assert 400 <= refused.status_code < 500
    assert Attempt.objects.filter(task=task).count() == 1
    too_long = admin.post(f"/tasks/{task.pk}/attempt", {"reason": "x" * 2001})
    assert too_long.status_code == 400
    assert Attempt.objects.filter(task=task).count() == 1
