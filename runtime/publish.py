"""Publishing work to the broker by task name: the modules that announce work (the outbox, the
drainers' hand-on, due timers) never import the Celery tasks that run it (runtime.worker sits
on top of the runtime and imports the services; nothing below imports it back).

The names are the contract with runtime.worker's ``@shared_task(name=...)``: a test checks
that each name here is a registered task. A message published while a request id is bound (the
web request that caused the work, or the delivery that carries one: runtime.logcontext) has it
in its headers, and the worker binds it for that delivery (runtime.worker)."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from celery import current_app
from celery.utils import uuid
from django.conf import settings
from kombu.serialization import dumps

from runtime.logcontext import REQUEST_ID, request_id_current

EXECUTE_OPERATION = "runtime.execute_operation"
DRAIN_QUEUE = "runtime.drain_queue"
WAKE_WAIT = "runtime.wake_wait"
NOTIFY_DISPATCH = "runtime.notify_dispatch"
RETENTION = "runtime.retention"

TASK_NAMES = (EXECUTE_OPERATION, DRAIN_QUEUE, WAKE_WAIT, NOTIFY_DISPATCH, RETENTION)
# The messages about the work a request caused carry its id; a drainer's turn is about a
# queue (the calls of many requests), and retention about none.
_CARRY_REQUEST_ID = frozenset({EXECUTE_OPERATION, WAKE_WAIT, NOTIFY_DISPATCH})


def publish(
    name: str,
    *args: Any,
    countdown: float = 0.0,
    queue: str | None = None,
    request_id: str | None = None,
) -> None:
    """Send one message for task ``name`` (None ``queue``: the default queue); a message about
    one piece of work carries ``request_id`` (by default the one bound now, if any). Raises
    what the broker raised: callers keep their database record, so a failed publish loses
    nothing."""
    # A Redis queue is a list that the push creates: declaring it first cost a round trip per
    # message whenever kombu's per-connection cache of declarations missed. The embedded
    # broker's queues are rows, which the declaration creates.
    declare: list[Any] | None = None if settings.EMBEDDED_BROKER else []
    carried = (request_id or request_id_current()) if name in _CARRY_REQUEST_ID else None
    current_app.send_task(
        name,
        args=args,
        countdown=countdown or None,
        queue=queue,
        declare=declare,
        headers={REQUEST_ID: carried} if carried else None,
    )


def message_now(
    name: str, *args: Any, queue: str | None = None, trace: dict[str, str] | None = None
) -> tuple[str, bytes] | None:
    """The broker list and the bytes ``publish(name, *args, queue=queue)`` would push, for a
    caller that pushes them itself (in one round trip with a look at the drainers:
    runtime.drainers.announce_or_push): one ``LPUSH`` onto the list named after the queue.
    None where that shape does not hold (the embedded broker, a broker other than REDIS_URL,
    transport options that rename lists, a queue not of Celery's default kind): then
    ``publish``. A test compares these bytes with what ``publish`` pushes. ``trace``: the trace
    context the work continues (runtime.tracing.carrier), in the headers where Celery's
    instrumentation puts it on ``publish`` (the worker's side reads it from there)."""
    if settings.EMBEDDED_BROKER or settings.CELERY_BROKER_URL != settings.REDIS_URL:
        return None
    app = current_app
    queue = queue or app.conf.task_default_queue
    key = (name, queue, app.thread_oid, os.getpid())
    template = _templates.get(key)
    if template is None:
        template = _template(name, queue)
        if template is None:
            return None
        if len(_templates) > 256:  # threads come and go; a template is cheap to build again
            _templates.clear()
        _templates[key] = template
    headers, properties, embed, envelope = template
    task_id = uuid()
    body = json.dumps([list(args), {}, embed]).encode()
    request_id = request_id_current()
    ids = {REQUEST_ID: request_id} if request_id else {}
    message = {
        **envelope,
        "body": base64.b64encode(body).decode(),
        # argsrepr as Celery's saferepr writes it for ids and numbers (the test compares them).
        "headers": {
            **headers,
            **(trace or {}),
            "id": task_id,
            "root_id": task_id,
            "argsrepr": repr(args),
            **ids,
        },
        "properties": {**properties, "correlation_id": task_id, "delivery_tag": uuid()},
    }
    return queue, json.dumps(message).encode()


# What stays the same in every message of one task name, queue, thread (its reply_to) and
# process (its origin): built once by Celery, then only the ids and arguments change.
_templates: dict[tuple[str, str, str, int], tuple[dict[str, Any], ...]] = {}


def _template(name: str, queue: str) -> tuple[dict[str, Any], ...] | None:
    """Celery's task message (``as_task_v2``, as ``send_task`` builds it) in the envelope of
    kombu's Redis transport for a queue of Celery's default kind: a direct exchange named after
    the queue, sent on the anonymous exchange, at priority 0."""
    app = current_app
    if set(app.conf.broker_transport_options or {}) - {"visibility_timeout"}:
        return None
    if app.conf.task_default_priority or app.conf.task_queue_max_priority:
        return None  # kombu would push onto a priority's own list
    declared = app.amqp.queues.get(queue)
    if declared is None or declared.exchange.type != "direct":
        return None
    headers, properties, body, _ = app.amqp.as_task_v2(
        "",
        name,
        (),
        None,
        reply_to=app.thread_oid,
        ignore_result=None,  # type: ignore[arg-type]  # what send_task passes (null header)
        kwargsrepr="{}",
    )
    content_type, encoding, _ = dumps(body, serializer=app.conf.task_serializer)
    envelope = {
        "content-encoding": encoding,
        "content-type": content_type,
    }
    properties = {
        **properties,
        "delivery_mode": declared.exchange.delivery_mode or 2,
        "delivery_info": {"exchange": "", "routing_key": queue},
        "priority": 0,
        "body_encoding": "base64",
    }
    return headers, properties, body[2], envelope
