"""Publishing work to the broker by task name: the modules that announce work (the outbox, the
drainers' hand-on, due timers) never import the Celery tasks that run it (runtime.worker sits
on top of the runtime and imports the services; nothing below imports it back).

The names are the contract with runtime.worker's ``@shared_task(name=...)``: a test checks
that each name here is a registered task."""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.conf import settings

EXECUTE_OPERATION = "runtime.execute_operation"
DRAIN_QUEUE = "runtime.drain_queue"
WAKE_WAIT = "runtime.wake_wait"
NOTIFY_DISPATCH = "runtime.notify_dispatch"

TASK_NAMES = (EXECUTE_OPERATION, DRAIN_QUEUE, WAKE_WAIT, NOTIFY_DISPATCH)


def publish(name: str, *args: Any, countdown: float = 0.0, queue: str | None = None) -> None:
    """Send one message for task ``name`` (None ``queue``: the default queue). Raises what the
    broker raised: callers keep their database record, so a failed publish loses nothing."""
    # A Redis queue is a list that the push creates: declaring it first cost a round trip per
    # message whenever kombu's per-connection cache of declarations missed. The embedded
    # broker's queues are rows, which the declaration creates.
    declare: list[Any] | None = None if settings.EMBEDDED_BROKER else []
    current_app.send_task(
        name, args=args, countdown=countdown or None, queue=queue, declare=declare
    )
