"""New code meeting old work: an operation recorded under a tool version this worker does not
support goes to manual intervention with the reason, instead of running different code."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime.models import Event, Invocation, Operation
from tests import factories
from tests.conftest import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]


def test_unsupported_recorded_version_goes_to_manual_intervention(workers):
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"a": 1})
    # As if the operation had been recorded by an older deployment's adapter.
    Operation.objects.filter(pk=op.pk).update(tool_version="0-retired")
    current = factories.operation(owner, task, params={"b": 2})

    workers.start(count=1, concurrency=1)
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "manual_intervention",
        timeout=60,
        what="the refusal",
    )
    wait_for(lambda: Operation.objects.get(pk=current.pk).status == "succeeded", timeout=60)
    op.refresh_from_db()
    assert "0-retired" in op.status_reason
    assert "does not support" in op.status_reason
    assert not Invocation.objects.filter(operation=op).exists()
    refusal = Event.objects.get(operation=op, type="operation.version_refused")
    assert "0-retired" in refusal.data["reason"]
    task.refresh_from_db()
    assert task.condition == "waiting"  # a person must decide

    viewer = factories.console_user("operator")
    browser = Client()
    assert browser.login(username=viewer.actor.name, password=factories.PASSWORD)
    page = browser.get(f"/tasks/{task.pk}/").content.decode()
    assert "manual_intervention" in page
    assert "0-retired" in page
