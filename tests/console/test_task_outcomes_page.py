"""The task page's outcomes section (server-rendered): artifacts with digest, size, stage,
provenance, download and an escaped preview; checks with their results; the dashboard counts
succeeded tasks."""

from __future__ import annotations

import io

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from runtime import completion
from runtime.artifacts import UploadSpec, artifact_accept, artifact_upload
from runtime.models import Task
from runtime.transitions.status import operation_transition_txn
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True)]


def _browser(role: str) -> Client:
    person = factories.console_user(role)
    client = Client()
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client


def _accept(owner, task, name, data, media_type="text/plain"):
    made = artifact_upload(
        owner.actor,
        task.pk,
        UploadSpec(name=name, media_type=media_type),
        io.BytesIO(data),
    )
    version = Task.objects.get(pk=task.pk).state_version
    return artifact_accept(owner.actor, made.pk, expected_state_version=version)


def test_artifacts_and_checks_on_the_task_page(fs_artifacts):
    owner = factories.agent()
    task = factories.task(
        owner,
        required_checks=[
            {
                "name": "notes present",
                "checker": "artifact_present",
                "config": {"artifact": "notes.txt"},
            }
        ],
    )
    op = factories.operation(owner, task, step="write", executor="agent")
    with transaction.atomic():
        operation_transition_txn(op, "running", now=timezone.now(), actor="user:test")
        operation_transition_txn(op, "succeeded", now=timezone.now(), actor="user:test")
    made = artifact_upload(
        owner.actor,
        task.pk,
        UploadSpec(name="notes.txt", media_type="text/plain", operation_id=op.pk),
        io.BytesIO(b"<script>alert(1)</script> hello"),
    )
    operator = _browser("operator")
    page = operator.get(f"/tasks/{task.pk}/").content.decode()
    assert 'id="task-outcomes"' in page and "notes present" in page and "not run yet" in page
    assert made.digest[:23] in page and f"{made.size} B" in page
    assert f'href="/api/v1/artifacts/{made.pk}/content"' in page
    assert f"/api/v1/artifacts/{made.pk}/provenance?download=1" in page
    assert op.pk in page  # provenance: the producing operation
    assert "&lt;script&gt;alert(1)&lt;/script&gt; hello" in page
    assert "<script>alert(1)</script>" not in page

    version = Task.objects.get(pk=task.pk).state_version
    artifact_accept(owner.actor, made.pk, expected_state_version=version)
    assert completion.task_complete(owner.actor, task.pk).outcome == "succeeded"
    fragment = operator.get(f"/tasks/{task.pk}/outcomes").content.decode()
    assert 'data-check="notes present" data-result="passed" data-counts="true"' in fragment
    assert 'data-status="accepted"' in fragment and "checks: passed" in fragment
    # The session reaches the download too (the console's people use the same API).
    content = operator.get(f"/api/v1/artifacts/{made.pk}/content")
    assert b"".join(content.streaming_content) == b"<script>alert(1)</script> hello"
    assert content["Content-Security-Policy"].startswith("sandbox")


def test_the_dashboard_counts_succeeded_tasks():
    owner = factories.agent()
    completion.task_complete(owner.actor, factories.task(owner).pk)
    completion.task_complete(owner.actor, factories.task(owner).pk)
    factories.task(owner)
    page = _browser("support").get("/").content.decode()
    assert '<td data-count="outcome-succeeded">2</td>' in page


def test_the_outcomes_fragment_needs_a_console_role(fs_artifacts):
    owner = factories.agent()
    task = factories.task(owner)
    person = factories.console_user("operator")
    from django.contrib.auth.models import Group

    Group.objects.get(name="operator").user_set.remove(person.actor.user_id)
    client = Client()
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    assert client.get(f"/tasks/{task.pk}/outcomes").status_code == 403
    assert Client().get(f"/tasks/{task.pk}/outcomes").status_code == 302


def test_the_task_page_shows_how_each_attempt_ended():
    from runtime.attempts import attempt_create

    alice = factories.agent()
    task = factories.task(alice)
    attempt_create(alice.actor, task.pk, reason="second <try>")
    completion.task_complete(alice.actor, task.pk)
    page = _browser("operator").get(f"/tasks/{task.pk}/").content.decode()
    assert 'data-attempt-outcome="failed"' in page  # the first, replaced by the second
    assert 'data-attempt-outcome="succeeded"' in page  # the second, with its task
    assert "replaced by attempt 2: second &lt;try&gt;" in page
