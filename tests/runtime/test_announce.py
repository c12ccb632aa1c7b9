"""A proposal's call is announced in one Redis round trip (runtime.drainers.announce_or_push):
one script leaves it to a registered drainer or pushes its Celery message onto the queue's
list. The message is built by hand from Celery's own parts (runtime.publish.message_now), so
it is pinned here to what Celery's ``send_task`` pushes; where that shape does not hold, or
Redis fails, the call goes through Celery as before."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import current_app
from django.conf import settings
from structlog.contextvars import bound_contextvars

from runtime import drainers, outbox
from runtime import publish as publish_module
from runtime.admission import tool_class_of
from runtime.drainers import Registration, queue_of
from runtime.models import OutboxMessage
from runtime.publish import DRAIN_QUEUE, EXECUTE_OPERATION, message_now, publish
from runtime.specs import OperationSpec
from runtime.transitions.propose import operation_propose
from tests import factories

QUEUE = settings.CELERY_QUEUE
KEYS = (QUEUE, f"drainers:{QUEUE}", f"drain:{QUEUE}", f"drain1:{QUEUE}")


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    client.delete(*KEYS)
    yield client
    client.delete(*KEYS)


def _ids_apart(raw: bytes) -> tuple[dict[str, Any], list[str]]:
    """The message with its per-message ids taken out (the task id three times, the delivery
    tag), and those ids."""
    message = json.loads(raw)
    headers, properties = message["headers"], message["properties"]
    ids = [headers.pop("id"), headers.pop("root_id"), properties.pop("correlation_id")]
    ids.append(properties.pop("delivery_tag"))
    return message, ids


@pytest.mark.postgres
def test_the_message_built_by_hand_is_the_one_celery_publishes(broker):
    publish(EXECUTE_OPERATION, "op_pinned", 7)
    celery_message, celery_ids = _ids_apart(broker.rpop(QUEUE))
    built = message_now(EXECUTE_OPERATION, "op_pinned", 7)
    assert built is not None
    queue, raw = built
    assert queue == QUEUE  # the list Celery pushed onto
    message, ids = _ids_apart(raw)
    assert message == celery_message
    # One task id in the three places Celery puts it; a fresh delivery tag.
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert celery_ids[0] == celery_ids[1] == celery_ids[2] != celery_ids[3]
    # The next message (from the same template) has ids of its own and its own arguments.
    again = message_now(EXECUTE_OPERATION, "op_next", 8)
    assert again is not None
    next_message, next_ids = _ids_apart(again[1])
    assert set(next_ids).isdisjoint(ids)
    assert next_message["headers"]["argsrepr"] == "('op_next', 8)"
    assert json.loads(base64.b64decode(next_message["body"]))[0] == ["op_next", 8]


@pytest.mark.postgres
def test_the_message_is_left_to_celery_where_its_shape_is_not_the_default(settings, monkeypatch):
    assert message_now(EXECUTE_OPERATION, "op", 1, queue="no-such-queue") is None
    # A default priority: kombu would push onto that priority's own list.
    monkeypatch.setattr(publish_module, "_templates", {})
    monkeypatch.setitem(current_app.conf, "task_default_priority", 3)
    assert message_now(EXECUTE_OPERATION, "op", 1) is None
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/15"  # not the REDIS_URL we push on
    assert message_now(EXECUTE_OPERATION, "op", 1) is None


def test_the_embedded_broker_takes_no_message_built_by_hand(settings):
    settings.EMBEDDED_BROKER = True
    assert message_now(EXECUTE_OPERATION, "op", 1) is None


@pytest.fixture
def round_trips(monkeypatch) -> list[str]:
    """The Redis commands this process sends, one per round trip (no pipeline is expected)."""
    sent: list[str] = []
    real = redis.Redis.execute_command

    def counted(self: redis.Redis, *args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return real(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", counted)
    return sent


@pytest.fixture
def no_celery(monkeypatch) -> list[str]:
    """Celery's own publish, recorded (it should not be reached)."""
    called: list[str] = []
    monkeypatch.setattr(outbox, "publish", lambda name, *args, **kw: called.append(args[0]))
    return called


def _propose(owner: factories.Principal, task: Any, step: str, tool: str = "demo.slow") -> str:
    op, _ = operation_propose(
        owner.actor, task.pk, OperationSpec(tool=tool, step=step, params={"seconds": 0})
    )
    return op.pk


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_proposal_over_rest_is_announced_in_one_round_trip(broker, round_trips, no_celery):
    owner = factories.agent()
    task = factories.task(owner)
    client = owner.client()
    assert client.get(f"/api/v1/tasks/{task.pk}").status_code == 200
    round_trips.clear()
    response = client.post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "demo.slow", "step": "s", "params": {"seconds": 0}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert response.status_code == 201, response.content
    # Two scripts in all: the token's rate (runtime.throttle, one per request, pinned by its own
    # tests) and the call's announcement, in one round trip of its own.
    assert [c for c in round_trips if c != "PUBLISH"] == ["EVALSHA", "EVALSHA"]
    assert no_celery == []
    # What was pushed is the operation's Celery message, with its outbox row.
    body = json.loads(broker.rpop(QUEUE))["body"]
    args = json.loads(base64.b64decode(body))[0]
    op_id = response.json()["id"]
    assert args == [op_id, OutboxMessage.objects.get(operation_id=op_id).pk]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_with_a_drainer_registered_the_same_round_trip_leaves_the_call_to_it(
    broker, round_trips, no_celery
):
    owner = factories.agent()
    task = factories.task(owner)
    registration = Registration(queue_of("demo.slow"))
    assert registration.renew()
    try:
        round_trips.clear()
        alone = _propose(owner, task, "alone")
        quick = _propose(owner, task, "quick", tool="demo.echo")
        assert [c for c in round_trips if c != "PUBLISH"] == ["EVALSHA", "EVALSHA"]
    finally:
        registration.leave()
    assert broker.lrange(f"drain1:{QUEUE}", 0, -1) == [alone.encode()]
    assert broker.lrange(f"drain:{QUEUE}", 0, -1) == [quick.encode()]
    assert broker.llen(QUEUE) == 0 and no_celery == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_call_no_drainer_may_take_is_pushed_even_while_one_is_registered(
    broker, no_celery, settings
):
    settings.TOOL_CONCURRENCY = {**settings.TOOL_CONCURRENCY, tool_class_of("demo.slow"): 5}
    owner = factories.agent()
    task = factories.task(owner)
    registration = Registration(QUEUE)
    assert registration.renew()
    try:
        op_id = _propose(owner, task, "limited")
    finally:
        registration.leave()
    assert broker.llen(f"drain1:{QUEUE}") == 0
    assert json.loads(broker.rpop(QUEUE))["headers"]["argsrepr"].startswith(f"('{op_id}'")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_when_the_script_fails_the_call_goes_through_celery(broker, monkeypatch):
    """Redis is not asked again (the drainers' own script would fail the same way, after its
    timeout, on the request's path): the call goes to Celery's publish at once."""
    asked: list[str] = []

    def unreachable(source: str) -> Any:
        asked.append(source)
        raise redis.ConnectionError("down")

    monkeypatch.setattr(drainers, "_script", unreachable)
    owner = factories.agent()
    task = factories.task(owner)
    op_id = _propose(owner, task, "through-celery")  # a call a drainer may take, run alone
    message = json.loads(broker.rpop(QUEUE))
    assert message["headers"]["argsrepr"].startswith(f"('{op_id}'")
    assert asked == [drainers._ANNOUNCE_OR_PUSH]


@pytest.mark.postgres
def test_a_bound_request_id_rides_in_the_headers_of_both_forms_of_the_message(broker):
    """The web request's id (runtime.logcontext) goes with the work it causes: Celery's message
    and the one built by hand carry it alike (the worker binds it: runtime.worker)."""
    with bound_contextvars(request_id="req-announce-1"):
        publish(EXECUTE_OPERATION, "op_pinned", 7)
        built = message_now(EXECUTE_OPERATION, "op_pinned", 7)
    celery_message, _ = _ids_apart(broker.rpop(QUEUE))
    assert built is not None
    message, _ = _ids_apart(built[1])
    assert message == celery_message
    assert message["headers"]["request_id"] == "req-announce-1"
    # Nothing bound, nothing carried.
    unbound = message_now(EXECUTE_OPERATION, "op_pinned", 7)
    assert unbound is not None and "request_id" not in json.loads(unbound[1])["headers"]
    # A drainer's turn is about a queue, the calls of many requests: it carries none.
    with bound_contextvars(request_id="req-announce-1"):
        publish(DRAIN_QUEUE, QUEUE)
    drain = json.loads(broker.rpop(QUEUE))
    assert drain["headers"]["task"] == DRAIN_QUEUE and "request_id" not in drain["headers"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("hotpath", [True, False])
def test_the_outbox_row_keeps_the_request_id_for_a_message_published_again(
    broker, settings, hotpath
):
    """The one-statement proposal and the general writer both write the request id into the
    outbox row; the sweeper's publish of that row, outside any request, carries it."""
    settings.HOTPATH = hotpath
    owner = factories.agent()
    with bound_contextvars(request_id="req-outbox-1"):
        op = factories.operation(owner, factories.task(owner), tool="demo.echo")
    row = OutboxMessage.objects.get(operation_id=op.pk)
    assert row.payload == {"request_id": "req-outbox-1"}
    broker.delete(QUEUE)
    assert outbox.outbox_publish([row]) == 1
    (raw,) = broker.lrange(QUEUE, 0, -1)
    headers = json.loads(raw)["headers"]
    assert headers["argsrepr"].startswith(f"('{op.pk}'")
    assert headers["request_id"] == "req-outbox-1"
