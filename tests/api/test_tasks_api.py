"""Tasks over REST: creation and its shape, reads, the caller's own list with filters, and keyset
pagination that neither skips nor repeats a task."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from runtime.models import Event, Task
from runtime.transitions.status import operation_transition_txn, task_transition_txn
from tests import factories
from tests.api.support import TASK_FIELDS, assert_error, post_json

pytestmark: list[pytest.MarkDecorator] = []


def _parse_time(value: str) -> datetime:
    assert value.endswith("Z"), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _claim(client, op_id: str) -> int:
    response = client.post(f"/api/v1/operations/{op_id}/claim")
    assert response.status_code == 200, response.content
    return int(response.json()["lease_generation"])


def _make_waiting(owner, task) -> None:
    """Leave ``task`` waiting on a person: its only operation needs manual intervention."""
    op = factories.operation(owner, task)
    with transaction.atomic():
        operation_transition_txn(op, "manual_intervention", now=timezone.now(), actor="user:test")


def _walk(client, query: dict[str, str]) -> list[list[str]]:
    """Every page of the task list, following ``next`` until it is null."""
    pages: list[list[str]] = []
    params = dict(query)
    while True:
        response = client.get("/api/v1/tasks", params)
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append([t["id"] for t in body["results"]])
        if body["next"] is None:
            return pages
        assert len(pages) < 20, "the cursor does not advance"
        params = {**query, "cursor": body["next"]}


def test_create_returns_201_with_the_task_shape(db):
    alice = factories.agent()
    before = timezone.now()
    response = post_json(
        alice.client(),
        "/api/v1/tasks",
        {"name": "  summarise the inbox ", "input": {"folder": "INBOX"}, "deadline_seconds": 600},
    )
    assert response.status_code == 201, response.content
    task = response.json()
    assert set(task) >= TASK_FIELDS
    assert task["name"] == "summarise the inbox"
    assert task["condition"] == "runnable"
    assert task["outcome"] is None
    assert isinstance(task["state_version"], int) and task["state_version"] >= 1
    assert set(task["attempt"]) >= {"id", "number"} and task["attempt"]["number"] == 1
    assert task["cancellation"] == "none"
    assert task["paused"] is False
    assert task["pending"] == []
    created = _parse_time(task["created_at"])
    assert before <= created <= timezone.now()
    deadline = _parse_time(task["deadline"])
    assert timedelta(seconds=599) <= deadline - created <= timedelta(seconds=601)

    stored = Task.objects.get(pk=task["id"])
    assert stored.agent_id == alice.actor.agent_id
    assert stored.input == {"folder": "INBOX"}
    assert stored.current_attempt_id == task["attempt"]["id"]
    assert list(Event.objects.filter(task=stored).values_list("type", flat=True)) == [
        "task.created"
    ]


def test_create_without_deadline_has_none(db):
    response = post_json(factories.agent().client(), "/api/v1/tasks", {"name": "open-ended"})
    assert response.status_code == 201
    assert response.json()["deadline"] is None


def test_get_one_returns_the_same_task_with_its_pending_operations(db):
    alice = factories.agent()
    task = factories.task(alice, "with work")
    op = factories.operation(alice, task)

    response = alice.client().get(f"/api/v1/tasks/{task.pk}")
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= TASK_FIELDS
    assert body["id"] == task.pk and body["name"] == "with work"
    assert body["pending"] == [op.pk]


def test_get_unknown_task_is_404(db):
    response = factories.agent().client().get("/api/v1/tasks/tsk_doesnotexist")
    assert_error(response, 404, "not_found")


def test_list_shows_only_the_callers_tasks_newest_first(db):
    alice, bob = factories.agent(), factories.agent()
    mine = [factories.task(alice, f"alice {i}").pk for i in range(3)]
    factories.task(bob, "bob's")

    body = alice.client().get("/api/v1/tasks").json()
    assert [t["id"] for t in body["results"]] == list(reversed(mine))
    assert body["next"] is None
    assert all(set(t) >= TASK_FIELDS for t in body["results"])


def test_list_filters_by_condition_and_outcome(db):
    alice = factories.agent()
    idle = factories.task(alice, "idle")
    waiting = factories.task(alice, "waiting")
    _make_waiting(alice, waiting)
    running = factories.task(alice, "running")
    client = alice.client()
    _claim(client, factories.operation(alice, running, executor="agent").pk)
    ended = factories.task(alice, "ended")
    with transaction.atomic():
        task_transition_txn(
            ended,
            now=timezone.now(),
            actor="user:test",
            fields={"outcome": "cancelled"},
            event_type="task.cancelled",
            target_condition="terminal",
        )

    def ids(**query: str) -> set[str]:
        response = client.get("/api/v1/tasks", query)
        assert response.status_code == 200, response.content
        return {t["id"] for t in response.json()["results"]}

    assert ids(condition="waiting") == {waiting.pk}
    assert ids(condition="running") == {running.pk}
    assert ids(condition="runnable") == {idle.pk}
    assert ids(condition="terminal") == {ended.pk}
    assert ids(outcome="cancelled") == {ended.pk}
    assert ids(outcome="succeeded") == set()
    assert ids(condition="terminal", outcome="failed") == set()
    assert ids() == {idle.pk, waiting.pk, running.pk, ended.pk}


@pytest.mark.parametrize(
    "query", [{"condition": "finished"}, {"outcome": "maybe"}, {"condition": "RUNNABLE"}]
)
def test_list_refuses_unknown_filter_values(db, query):
    assert_error(factories.agent().client().get("/api/v1/tasks", query), 400, "invalid_input")


def test_keyset_pages_cover_every_task_once(db):
    alice = factories.agent()
    created = [factories.task(alice, f"t{i}").pk for i in range(7)]
    factories.task(factories.agent(), "someone else's")

    pages = _walk(alice.client(), {"limit": "3"})
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [tid for page in pages for tid in page] == list(reversed(created))


def test_keyset_pages_break_creation_time_ties_by_id(db):
    # Tasks created in the same instant (a batch) must still page without gap or repeat.
    alice = factories.agent()
    created = [factories.task(alice, f"t{i}").pk for i in range(7)]
    Task.objects.filter(pk__in=created).update(created_at=timezone.now())

    pages = _walk(alice.client(), {"limit": "3"})
    seen = [tid for page in pages for tid in page]
    assert seen == sorted(created, reverse=True)


def test_keyset_pagination_with_a_filter_stays_within_it(db):
    alice = factories.agent()
    waiting = []
    for i in range(5):
        task = factories.task(alice, f"w{i}")
        _make_waiting(alice, task)
        waiting.append(task.pk)
        factories.task(alice, f"idle{i}")

    pages = _walk(alice.client(), {"limit": "2", "condition": "waiting"})
    assert [tid for page in pages for tid in page] == list(reversed(waiting))


def test_a_page_exactly_full_has_no_next(db):
    alice = factories.agent()
    for i in range(3):
        factories.task(alice, f"t{i}")
    body = alice.client().get("/api/v1/tasks", {"limit": "3"}).json()
    assert len(body["results"]) == 3
    assert body["next"] is None
