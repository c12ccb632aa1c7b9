"""Get-or-create a task by the caller's own key (issue 38, point 2): ``external_id`` at creation
finds the task created under it when the input is the same (200, the task as it is now), is
refused when the input differs (422 ``idempotency_key_reused`` naming the field), is another
owner's key space for each owner, and is what the list's ``external_id`` filter, the API's and
the console's search and the task body show. (The race between two processes is
tests/runtime/test_task_keys.py.)"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from runtime.models import Event, Task
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = pytest.mark.django_db

SPEC = {"name": "reconcile march", "input": {"month": "2026-03"}, "budget": {"cost_cents": 500}}


def _create(client, body, **headers):
    return post_json(client, "/api/v1/tasks", body, **headers)


def test_creating_again_under_the_key_returns_the_same_task_as_it_is_now():
    alice = factories.agent()
    client = alice.client()
    first = _create(client, {**SPEC, "external_id": "run-42"})
    assert first.status_code == 201, first.content
    task = first.json()
    assert task["external_id"] == "run-42"
    # The task moves on before the agent restarts: the second creation shows it as it is now.
    paused = post_json(client, f"/api/v1/tasks/{task['id']}/pause", {})
    assert paused.status_code in (200, 202), paused.content

    again = _create(client, {**SPEC, "external_id": "run-42"})
    assert again.status_code == 200, again.content
    body = again.json()
    assert body["id"] == task["id"]
    assert body["paused"] is True
    assert body["external_id"] == "run-42"
    assert Task.objects.filter(agent_id=alice.actor.agent_id).count() == 1
    assert Event.objects.filter(task_id=task["id"], type="task.created").count() == 1


def test_the_same_input_written_otherwise_is_the_same_input():
    alice = factories.agent()
    client = alice.client()
    first = _create(
        client,
        {
            **SPEC,
            "name": "  reconcile march ",
            "compensate_on": ["failed", "cancelled"],
            "external_id": "k",
        },
    )
    assert first.status_code == 201, first.content
    again = _create(
        client,
        {
            "budget": {"cost_cents": 500},
            "input": {"month": "2026-03"},
            "name": "reconcile march",
            "compensate_on": ["cancelled", "failed"],
            "external_id": "k",
        },
    )
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]


@pytest.mark.parametrize(
    "change",
    [
        {"name": "reconcile april"},
        {"input": {"month": "2026-04"}},
        {"budget": {"cost_cents": 501}},
        {"deadline_seconds": 60},
        {"compensate_on": ["failed"]},
    ],
)
def test_other_input_under_the_key_is_refused_and_changes_nothing(change):
    alice = factories.agent()
    client = alice.client()
    first = _create(client, {**SPEC, "external_id": "run-7"})
    assert first.status_code == 201, first.content
    refused = _create(client, {**SPEC, **change, "external_id": "run-7"})
    body = assert_error(refused, 422, "idempotency_key_reused")
    assert body["field"] == "external_id"
    assert Task.objects.filter(agent_id=alice.actor.agent_id).count() == 1
    assert Task.objects.get(pk=first.json()["id"]).name == "reconcile march"


def test_each_owner_has_its_own_keys_and_never_finds_anothers_task():
    alice, bob = factories.agent(), factories.agent()
    script = factories.console_user("operator")
    ids = set()
    for principal in (alice, bob, script):
        response = _create(principal.client(), {**SPEC, "external_id": "shared-name"})
        assert response.status_code == 201, response.content
        ids.add(response.json()["id"])
    assert len(ids) == 3
    # Another owner's different input under the same key is no conflict either.
    other = _create(bob.client(), {"name": "else", "external_id": "mine"})
    assert other.status_code == 201
    assert _create(alice.client(), {"name": "mine too", "external_id": "mine"}).status_code == 201


def test_a_key_is_checked_like_the_rest_of_the_input():
    client = factories.agent().client()
    for bad in ("", " padded", "x" * 201, "tab\tinside", "rtl\u202eoverride", 12):
        response = _create(client, {"name": "t", "external_id": bad})
        assert_error(response, 400)
    assert Task.objects.count() == 0
    assert _create(client, {"name": "t", "external_id": "with inner space"}).status_code == 201


def test_the_list_filter_and_the_search_find_the_task_by_its_key():
    alice, bob = factories.agent(), factories.agent()
    mine = _create(alice.client(), {"name": "n1", "external_id": "order 991"}).json()
    _create(alice.client(), {"name": "n2", "external_id": "order 992"})
    theirs = _create(bob.client(), {"name": "n3", "external_id": "order 991"}).json()

    listed = alice.client().get("/api/v1/tasks", {"external_id": "order 991"})
    assert listed.status_code == 200
    assert [t["id"] for t in listed.json()["results"]] == [mine["id"]]
    assert listed.json()["results"][0]["external_id"] == "order 991"
    searched = alice.client().get("/api/v1/tasks", {"q": "order 991"})
    assert [t["id"] for t in searched.json()["results"]] == [mine["id"]]
    assert alice.client().get("/api/v1/tasks", {"external_id": "order 9"}).json()["results"] == []

    # An operator sees every owner's task under the key, in the API and in the console.
    operator = factories.console_user("operator")
    found = operator.client().get("/api/v1/tasks", {"external_id": "order 991"}).json()
    assert {t["id"] for t in found["results"]} == {mine["id"], theirs["id"]}
    browser = Client()
    browser.force_login(get_user_model().objects.get(pk=operator.actor.user_id))
    page = browser.get("/tasks/", {"q": "order 991"})
    assert page.status_code == 200
    html = page.content.decode()
    assert mine["id"] in html and theirs["id"] in html
    detail = browser.get(f"/tasks/{mine['id']}/").content.decode()
    assert 'id="task-external-id">order 991<' in detail


def test_a_task_without_a_key_shows_null_and_is_created_every_time():
    client = factories.agent().client()
    first = _create(client, {"name": "plain"})
    second = _create(client, {"name": "plain"})
    assert first.status_code == second.status_code == 201
    assert first.json()["external_id"] is None
    assert first.json()["id"] != second.json()["id"]


def test_with_an_idempotency_key_the_first_response_is_replayed_and_the_key_still_holds():
    """The header replays the first response as it was (a snapshot: 201); a new request under
    the same external_id without the header is answered from the task (200)."""
    client = factories.agent().client()
    body = {**SPEC, "external_id": "both"}
    first = _create(client, body, HTTP_IDEMPOTENCY_KEY="req-1")
    assert first.status_code == 201
    replay = _create(client, body, HTTP_IDEMPOTENCY_KEY="req-1")
    assert replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]
    fresh = _create(client, body, HTTP_IDEMPOTENCY_KEY="req-2")
    assert fresh.status_code == 200
    assert fresh.json()["id"] == first.json()["id"]
    assert Task.objects.count() == 1
