"""Operations over REST: proposal and its shape, the derived idempotency key and parameter hash,
same intent returning the same operation, a reused key with other parameters refused with
nothing created, refusals by the task's state, and reads."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runtime.hashing import params_hash
from runtime.models import Event, Operation, OutboxMessage, Task
from runtime.transitions.status import task_transition_txn
from tests import factories
from tests.api.support import OPERATION_FIELDS, assert_error, post_json

pytestmark: list[pytest.MarkDecorator] = []


def _ops_url(task_id: str) -> str:
    return f"/api/v1/tasks/{task_id}/operations"


def _counts(task: Task) -> tuple[int, int, int]:
    return (
        Operation.objects.filter(task=task).count(),
        Event.objects.filter(task=task).count(),
        OutboxMessage.objects.filter(operation__task=task).count(),
    )


def test_propose_returns_201_with_the_operation_shape(db):
    alice = factories.agent()
    task = factories.task(alice)
    params = {"to": "ops@example.com", "n": 3, "nested": {"b": [1, 2], "a": None}}

    response = post_json(
        alice.client(), _ops_url(task.pk), {"tool": "demo.echo", "step": "greet", "params": params}
    )
    assert response.status_code == 201, response.content
    op = response.json()
    assert set(op) >= OPERATION_FIELDS
    assert op["task"] == task.pk
    assert op["attempt"] == task.current_attempt_id
    assert op["kind"] == "tool" and op["tool"] == "demo.echo" and op["step"] == "greet"
    assert op["params"] == params
    # Keys leave the system inside their owner's namespace (the task's agent).
    assert op["idempotency_key"] == f"{alice.actor.agent_id}/{task.pk}:greet:demo.echo:v1"
    assert op["params_hash"] == params_hash(params)
    assert op["params_hash"].startswith("sha256:")
    assert op["status"] == "pending"
    assert op["attempts_used"] == 0
    assert op["max_attempts"] >= 1
    assert op["lease_generation"] == 0
    assert isinstance(op["state_version"], int)
    assert op["result"] is None and op["error"] is None
    assert op["approval"] is None
    assert op["invocations"] == []
    # The task now lists it as pending, and a worker was told about it.
    assert alice.client().get(f"/api/v1/tasks/{task.pk}").json()["pending"] == [op["id"]]
    assert OutboxMessage.objects.filter(operation_id=op["id"]).count() == 1


def test_intent_version_is_part_of_the_derived_key(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    first = post_json(client, _ops_url(task.pk), {"tool": "demo.echo", "step": "s"})
    second = post_json(
        client,
        _ops_url(task.pk),
        {"tool": "demo.echo", "step": "s", "intent_version": 2, "params": {"changed": True}},
    )
    assert (first.status_code, second.status_code) == (201, 201)
    assert second.json()["idempotency_key"].endswith(f"/{task.pk}:s:demo.echo:v2")
    assert second.json()["id"] != first.json()["id"]


def test_same_intent_with_same_params_returns_the_existing_operation(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    first = post_json(
        client,
        _ops_url(task.pk),
        {"tool": "demo.echo", "step": "charge", "params": {"a": 1, "b": {"x": 2, "y": 3}}},
    )
    assert first.status_code == 201
    counts = _counts(task)

    # Same parameters in another key order: the hash is over canonical JSON.
    again = post_json(
        client,
        _ops_url(task.pk),
        {"step": "charge", "params": {"b": {"y": 3, "x": 2}, "a": 1}, "tool": "demo.echo"},
    )
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["params_hash"] == first.json()["params_hash"]
    assert _counts(task) == counts


def test_same_intent_with_different_params_is_422_and_creates_nothing(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    first = post_json(
        client, _ops_url(task.pk), {"tool": "demo.echo", "step": "pay", "params": {"amount": 5}}
    )
    assert first.status_code == 201
    counts = _counts(task)

    response = post_json(
        client, _ops_url(task.pk), {"tool": "demo.echo", "step": "pay", "params": {"amount": 50}}
    )
    assert_error(response, 422, "idempotency_key_reused")
    assert _counts(task) == counts
    assert Operation.objects.get(pk=first.json()["id"]).params == {"amount": 5}


def test_explicit_idempotency_key_dedupes_and_conflicts_the_same_way(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    body = {"tool": "demo.echo", "step": "one", "idempotency_key": "order-42", "params": {"q": 1}}
    first = post_json(client, _ops_url(task.pk), body)
    assert first.status_code == 201
    assert first.json()["idempotency_key"] == f"{alice.actor.agent_id}/order-42"
    counts = _counts(task)

    # The explicit key, not the step, names the action.
    same = post_json(client, _ops_url(task.pk), {**body, "step": "renamed"})
    assert same.status_code == 200
    assert same.json()["id"] == first.json()["id"]
    # So does the namespaced key read back from the operation.
    again = post_json(
        client, _ops_url(task.pk), {**body, "idempotency_key": first.json()["idempotency_key"]}
    )
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]

    assert_error(
        post_json(client, _ops_url(task.pk), {**body, "params": {"q": 2}}),
        422,
        "idempotency_key_reused",
    )
    assert _counts(task) == counts


def test_keys_are_scoped_to_their_task(db):
    alice = factories.agent()
    one, two = factories.task(alice), factories.task(alice)
    client = alice.client()
    body = {"tool": "demo.echo", "step": "s", "idempotency_key": "shared", "params": {"v": 1}}
    a = post_json(client, _ops_url(one.pk), body)
    b = post_json(client, _ops_url(two.pk), {**body, "params": {"v": 2}})
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]


def test_unknown_tool_is_400_and_creates_nothing(db):
    alice = factories.agent()
    task = factories.task(alice)
    counts = _counts(task)
    response = post_json(
        alice.client(), _ops_url(task.pk), {"tool": "demo.no_such_tool", "step": "s"}
    )
    assert_error(response, 400, "unknown_tool")
    assert _counts(task) == counts


def test_propose_on_an_unknown_task_is_404(db):
    response = post_json(
        factories.agent().client(), _ops_url("tsk_nope"), {"tool": "demo.echo", "step": "s"}
    )
    assert_error(response, 404, "not_found")


def _end(task: Task) -> None:
    with transaction.atomic():
        task_transition_txn(
            task,
            now=timezone.now(),
            actor="user:test",
            fields={"outcome": "failed"},
            event_type="task.failed",
            target_condition="terminal",
        )


def _cancel(task: Task) -> None:
    with transaction.atomic():
        task_transition_txn(
            task,
            now=timezone.now(),
            actor="user:test",
            fields={"cancellation": "requested"},
            event_type="t.cancel",
        )


def _pause(task: Task) -> None:
    with transaction.atomic():
        task_transition_txn(
            task, now=timezone.now(), actor="user:test", fields={"paused": True}, event_type="t.p"
        )


def _past_deadline(task: Task) -> None:
    Task.objects.filter(pk=task.pk).update(deadline=timezone.now() - timedelta(seconds=1))


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (_end, "task_terminal"),
        (_cancel, "task_cancelled"),
        (_pause, "task_paused"),
        (_past_deadline, "deadline_exceeded"),
    ],
)
def test_a_task_that_admits_no_work_refuses_with_409_and_creates_nothing(db, make, code):
    alice = factories.agent()
    task = factories.task(alice)
    make(task)
    counts = _counts(task)
    response = post_json(alice.client(), _ops_url(task.pk), {"tool": "demo.echo", "step": "s"})
    assert_error(response, 409, code)
    assert _counts(task) == counts


def test_get_one_operation_matches_what_the_proposal_returned(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    created = post_json(client, _ops_url(task.pk), {"tool": "demo.echo", "step": "s"}).json()

    response = client.get(f"/api/v1/operations/{created['id']}")
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= OPERATION_FIELDS
    assert {k: body[k] for k in OPERATION_FIELDS} == {k: created[k] for k in OPERATION_FIELDS}
    assert_error(client.get("/api/v1/operations/op_nope"), 404, "not_found")


def test_list_operations_by_status(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    pending = factories.operation(alice, task)
    running = factories.operation(alice, task, executor="agent")
    assert client.post(f"/api/v1/operations/{running.pk}/claim").status_code == 200
    stranger = factories.agent()
    factories.operation(stranger, factories.task(stranger))

    def ids(**query: str) -> list[str]:
        response = client.get("/api/v1/operations", query)
        assert response.status_code == 200, response.content
        return [op["id"] for op in response.json()["results"]]

    assert ids(status="running") == [running.pk]
    assert ids(status="pending") == [pending.pk]
    assert ids(status="unresolved") == []
    assert ids() == [pending.pk, running.pk]
    assert_error(client.get("/api/v1/operations", {"status": "done"}), 400, "invalid_input")


def test_operations_list_pages_with_its_cursor(db):
    alice = factories.agent()
    task = factories.task(alice)
    created = [factories.operation(alice, task).pk for _ in range(5)]
    client = alice.client()
    seen: list[str] = []
    query: dict[str, str] = {"limit": "2"}
    for _ in range(10):
        body = client.get("/api/v1/operations", query).json()
        seen += [op["id"] for op in body["results"]]
        if body["next"] is None:
            break
        query = {"limit": "2", "cursor": body["next"]}
    assert seen == created


def test_list_of_a_tasks_operations(db):
    alice = factories.agent()
    task, other = factories.task(alice), factories.task(alice)
    ops = [factories.operation(alice, task).pk for _ in range(2)]
    factories.operation(alice, other)
    body = alice.client().get(_ops_url(task.pk)).json()
    assert [op["id"] for op in body["results"]] == ops


@pytest.mark.postgres
def test_concurrent_identical_proposals_create_one_operation(transactional_db):
    alice = factories.agent()
    task = factories.task(alice)
    body = {"tool": "demo.echo", "step": "race", "params": {"v": 1}}
    start = threading.Barrier(6)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def propose() -> None:
        try:
            client = alice.client()
            start.wait(timeout=30)
            response = post_json(client, _ops_url(task.pk), body)
            with lock:
                results.append((response.status_code, response.json().get("id", "")))
        finally:
            connection.close()

    threads = [threading.Thread(target=propose) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 6
    assert sorted(status for status, _ in results) == [200] * 5 + [201]
    assert len({op_id for _, op_id in results}) == 1
    assert Operation.objects.filter(task=task).count() == 1
    assert Event.objects.filter(task=task, type="operation.proposed").count() == 1


@pytest.mark.django_db
def test_a_task_with_a_deadline_takes_operations_until_it_passes():
    """The embedded database hands a raw cursor's deadline back as naive text: admission must
    read it as UTC on SQLite as on PostgreSQL (this was a 500 in the default mode)."""
    client = factories.agent().client()
    created = post_json(client, "/api/v1/tasks", {"name": "x", "deadline_seconds": 3600})
    assert created.status_code == 201, created.content
    task_id = created.json()["id"]
    proposed = post_json(
        client, f"/api/v1/tasks/{task_id}/operations", {"tool": "demo.echo", "step": "s"}
    )
    assert proposed.status_code == 201, proposed.content
    _past_deadline(Task.objects.get(pk=task_id))
    late = post_json(
        client, f"/api/v1/tasks/{task_id}/operations", {"tool": "demo.echo", "step": "t"}
    )
    assert_error(late, 409, "deadline_exceeded")
