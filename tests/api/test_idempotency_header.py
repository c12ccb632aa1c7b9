"""The ``Idempotency-Key`` header on POSTs: the first response is stored and replayed, a reused
key with another body is 422, a key whose first request is still running is 409, keys belong to
one principal, and a refused request leaves its key free for a corrected retry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runtime.hashing import params_hash
from runtime.models import IdempotentRequest, Operation, Task
from tests import factories
from tests.api.support import assert_error, post_json, post_raw
from tests.concurrency import in_thread, lock_waiters
from tests.conftest import wait_for

pytestmark = pytest.mark.postgres


def _key(value: str) -> dict[str, str]:
    return {"HTTP_IDEMPOTENCY_KEY": value}


def test_replay_returns_the_stored_response_and_creates_nothing_more(db):
    alice = factories.agent()
    client = alice.client()
    body = {"name": "nightly report", "input": {"day": "mon"}}
    first = post_json(client, "/api/v1/tasks", body, **_key("create-1"))
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first

    # Same body with its keys in another order is the same request.
    replay = post_raw(
        client,
        "/api/v1/tasks",
        '{"input": {"day": "mon"}, "name": "nightly report"}',
        **_key("create-1"),
    )
    assert replay.status_code == 201
    assert replay.json() == first.json()
    assert replay["Idempotent-Replayed"] == "true"
    assert Task.objects.filter(agent_id=alice.actor.agent_id).count() == 1


def test_replay_of_an_operation_proposal(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    url = f"/api/v1/tasks/{task.pk}/operations"
    body = {"tool": "demo.echo", "step": "s", "params": {"x": 1}}
    first = post_json(client, url, body, **_key("op-1"))
    replay = post_json(client, url, body, **_key("op-1"))
    assert (first.status_code, replay.status_code) == (201, 201)
    assert replay.json() == first.json()
    assert Operation.objects.filter(task=task).count() == 1


def test_same_key_with_a_different_body_is_422_and_creates_nothing(db):
    alice = factories.agent()
    client = alice.client()
    assert post_json(client, "/api/v1/tasks", {"name": "a"}, **_key("k")).status_code == 201

    response = post_json(client, "/api/v1/tasks", {"name": "b"}, **_key("k"))
    assert_error(response, 422, "idempotency_key_reused")
    assert list(Task.objects.values_list("name", flat=True)) == ["a"]


def test_same_key_on_another_path_is_422(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    assert post_json(client, "/api/v1/tasks", {"name": "a"}, **_key("k")).status_code == 201
    response = post_json(
        client,
        f"/api/v1/tasks/{task.pk}/operations",
        {"name": "a"},
        **_key("k"),
    )
    assert_error(response, 422, "idempotency_key_reused")
    assert not Operation.objects.exists()


def test_same_key_while_the_first_request_is_in_progress_is_409(db):
    alice = factories.agent()
    body = {"name": "slow"}
    IdempotentRequest.objects.create(
        principal=alice.actor.key,
        key="busy",
        method="POST",
        path="/api/v1/tasks",
        body_hash=params_hash(body),
    )
    response = post_json(alice.client(), "/api/v1/tasks", body, **_key("busy"))
    assert_error(response, 409, "request_in_progress")
    assert not Task.objects.exists()
    # The first request still owns the key.
    assert IdempotentRequest.objects.get(key="busy").status == IdempotentRequest.STATUS_IN_PROGRESS


def test_a_first_request_that_died_stops_blocking_its_key(db):
    # Its business write and its stored response commit together, so a stale in-progress record
    # means nothing was written: the retry runs.
    alice = factories.agent()
    body = {"name": "crashed midway"}
    record = IdempotentRequest.objects.create(
        principal=alice.actor.key,
        key="orphan",
        method="POST",
        path="/api/v1/tasks",
        body_hash=params_hash(body),
    )
    IdempotentRequest.objects.filter(pk=record.pk).update(
        created_at=timezone.now() - timedelta(minutes=10)
    )
    client = alice.client()
    response = post_json(client, "/api/v1/tasks", body, **_key("orphan"))
    assert response.status_code == 201
    replay = post_json(client, "/api/v1/tasks", body, **_key("orphan"))
    assert replay.json() == response.json()
    assert Task.objects.count() == 1


def test_keys_are_scoped_per_principal(db):
    alice, bob = factories.agent(), factories.agent()
    a = post_json(alice.client(), "/api/v1/tasks", {"name": "alice's"}, **_key("same"))
    b = post_json(bob.client(), "/api/v1/tasks", {"name": "bob's"}, **_key("same"))
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    # Bob's replay is his own response, never Alice's.
    again = post_json(bob.client(), "/api/v1/tasks", {"name": "bob's"}, **_key("same"))
    assert again.json()["id"] == b.json()["id"]
    assert Task.objects.count() == 2


def test_a_console_user_and_an_agent_do_not_share_keys(db):
    agent, user = factories.agent(), factories.console_user("operator")
    a = post_json(agent.client(), "/api/v1/tasks", {"name": "one"}, **_key("k1"))
    b = post_json(user.client(), "/api/v1/tasks", {"name": "two"}, **_key("k1"))
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]


def test_a_refused_request_does_not_burn_the_key(db):
    alice = factories.agent()
    client = alice.client()
    assert_error(
        post_json(client, "/api/v1/tasks", {"input": {}}, **_key("retry-me")), 400, "invalid_input"
    )
    assert not IdempotentRequest.objects.filter(key="retry-me").exists()

    fixed = post_json(client, "/api/v1/tasks", {"name": "fixed"}, **_key("retry-me"))
    assert fixed.status_code == 201
    assert Task.objects.get().name == "fixed"


def test_a_domain_refusal_does_not_burn_the_key(db):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    url = f"/api/v1/tasks/{task.pk}/operations"
    assert_error(
        post_json(client, url, {"tool": "demo.nope", "step": "s"}, **_key("op")),
        400,
        "unknown_tool",
    )
    ok = post_json(client, url, {"tool": "demo.echo", "step": "s"}, **_key("op"))
    assert ok.status_code == 201


def test_malformed_json_under_a_key_is_400_and_leaves_the_key_free(db):
    alice = factories.agent()
    client = alice.client()
    assert_error(post_raw(client, "/api/v1/tasks", "{nope", **_key("j")), 400)
    assert not IdempotentRequest.objects.exists()
    assert post_json(client, "/api/v1/tasks", {"name": "ok"}, **_key("j")).status_code == 201


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there"])
def test_an_unusable_key_is_400_and_nothing_is_created(db, key):
    alice = factories.agent()
    response = alice.client().post(
        "/api/v1/tasks",
        data={"name": "x"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert_error(response, 400, "invalid_input")
    assert not Task.objects.exists()
    assert not IdempotentRequest.objects.exists()


def test_a_255_character_key_is_accepted(db):
    alice = factories.agent()
    response = post_json(alice.client(), "/api/v1/tasks", {"name": "x"}, **_key("k" * 255))
    assert response.status_code == 201


def test_concurrent_first_requests_with_one_key_create_one_task(transactional_db):
    alice = factories.agent()
    body = {"name": "exactly once"}
    start = threading.Barrier(6)
    statuses: list[int] = []
    bodies: list[dict] = []
    lock = threading.Lock()

    def send() -> None:
        try:
            client = alice.client()
            start.wait(timeout=30)
            response = post_json(client, "/api/v1/tasks", body, **_key("race"))
            with lock:
                statuses.append(response.status_code)
                bodies.append(response.json())
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(statuses) == 6
    # Each loser either saw the first still running or replayed its stored response.
    assert set(statuses) <= {201, 409}
    assert Task.objects.count() == 1
    task_id = Task.objects.get().pk
    for status, payload in zip(statuses, bodies, strict=True):
        if status == 201:
            assert payload["id"] == task_id
        else:
            assert payload["error"]["code"] == "request_in_progress"


# A statement that has begun (its snapshot is taken) and then waits for a lock the key's holder
# keeps until it commits, before it reaches its read: the widest form of the window between a
# claim's statement starting and the key's lock coming free.
_AFTER_A_WAIT = (
    "SELECT {columns} FROM (SELECT length(pg_advisory_xact_lock(4242)::text) + 1 AS one OFFSET 0)"
    " w CROSS JOIN LATERAL ({read}) c"
)
_BY_THE_CLAIM = _AFTER_A_WAIT.format(
    columns="c.taken, (c.existing).id",
    read="SELECT * FROM runtime_idempotency_claim(substr(%s, w.one), %s)",
)
_BY_A_PLAIN_READ = _AFTER_A_WAIT.format(
    columns="true, c.id",
    read="SELECT id FROM runtime_idempotentrequest WHERE principal = substr(%s, w.one)"
    ' AND "key" = %s',
)


def test_the_claim_sees_a_record_committed_while_its_statement_waited(transactional_db):
    """The claim takes the key's lock and reads its record in one round trip. The read must see a
    record that the key's previous holder committed after the claim's statement began: a read in
    the statement's own snapshot misses it, and the request would run a second time. Here both
    forms start while the holder has the key, wait behind it, and read once it committed; the
    plain read's miss shows the window was hit."""
    held, go = threading.Event(), threading.Event()

    def holder() -> int:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(4242)")
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 7))", ["p|k"])
            record = IdempotentRequest.objects.create(
                principal="p", key="k", method="POST", path="/", body_hash="h", status="done"
            )
            held.set()
            assert go.wait(timeout=30)
        return record.pk

    def claimer(sql: str) -> Callable[[], tuple[Any, ...] | None]:
        def run() -> tuple[Any, ...] | None:
            assert held.wait(timeout=30)
            with connection.cursor() as cur:
                cur.execute(sql, ["p", "k"])
                return cur.fetchone()

        return run

    _, committed = in_thread(holder, "holder")
    _, claimed = in_thread(claimer(_BY_THE_CLAIM), "claim")
    _, plain = in_thread(claimer(_BY_A_PLAIN_READ), "plain")
    wait_for(lambda: lock_waiters() >= 2, timeout=30, what="both reads waiting for the holder")
    go.set()
    record = committed.result(timeout=30)
    assert plain.result(timeout=30) is None  # the window: its snapshot predates the commit
    assert claimed.result(timeout=30) == (True, record)
