"""Celery tasks. Thin: each delegates to a runtime service. The top of the runtime's layers: it
imports the services and nothing in the runtime imports it (work is published by task name,
runtime.publish). Retrying is owned by the runtime (operation_report
schedules retries through the outbox), so Celery's autoretry is never used."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import shared_task
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
)
from django.conf import settings
from django.db import close_old_connections, connections

from runtime.executions import execution_current, execution_current_stop, heartbeat_thread_start
from runtime.executor import operation_deliver, queue_drain
from runtime.logcontext import REQUEST_ID, request_bind, request_unbind
from runtime.notifications.dispatch import notify_dispatch as _notify_dispatch
from runtime.retention import retention_run
from runtime.slots import slots_start, slots_stop
from runtime.waits import wait_wake

log = logging.getLogger(__name__)
_heartbeat_stop = threading.Event()


@worker_process_init.connect
def _child_started(**_: Any) -> None:
    # Connections inherited across fork break (celery #5483): every child opens its own.
    for conn in connections.all(initialized_only=True):
        conn.close()
    # Calls of tools that wait are made side by side in this process (runtime.slots).
    slots_start()
    try:
        execution_id = execution_current(label="celery")
        heartbeat_thread_start(execution_id, _heartbeat_stop)
    except Exception:
        log.warning("could not register this worker process", exc_info=True)


# A connection that served a task this recently is not health-checked before the next one.
BUSY_SECONDS = 1.0
_last_task_end = 0.0


@task_prerun.connect
def _connections_checked(**_: Any) -> None:
    # Connections are reused across tasks (CELERY_DB_REUSE_MAX): drop one that broke (a database
    # restart) or outlived CONN_MAX_AGE, as Django does at the start of each request.
    close_old_connections()
    if time.monotonic() - _last_task_end < BUSY_SECONDS:
        # Busy: the connection answered a moment ago, and its health check (CONN_HEALTH_CHECKS)
        # would cost a SELECT 1 round trip per operation. A worker back from idleness, when a
        # restart may have happened meanwhile, is still checked before its first query.
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:
                conn.health_check_done = True  # type: ignore[attr-defined]  # (not in the stubs)


@task_prerun.connect
def _request_bound(task: Any = None, **_: Any) -> None:
    # The web request that caused this message (runtime.publish put its id in the headers):
    # every line of this delivery carries its id, and what the delivery publishes passes it on.
    request_id = getattr(task.request, REQUEST_ID, None) if task is not None else None
    if request_id:
        request_bind(str(request_id))
    else:
        request_unbind()


@task_postrun.connect
def _task_ended(**_: Any) -> None:
    global _last_task_end
    _last_task_end = time.monotonic()
    request_unbind()


@worker_process_shutdown.connect
def _child_stopping(**_: Any) -> None:
    # The calls in this process's slots are reported first (for at most a lease: a call still
    # running then would lose its lease anyway); meanwhile the process is still alive.
    slots_stop(timeout=float(settings.LEASE_SECONDS))
    _heartbeat_stop.set()
    try:
        execution_current_stop()
    except Exception:
        log.debug("could not mark execution stopped", exc_info=True)


@shared_task(name="runtime.execute_operation", ignore_result=True, acks_late=True, bind=True)
def execute_operation(self: Any, operation_id: str, outbox_id: int | None = None) -> str:
    delivery = operation_deliver(operation_id)
    # Only the delivery of a call a drainer may take looks for a backlog to drain (a drainer
    # started by calls it could not take sat idle on an empty list instead of taking messages).
    if delivery.drainable and not self.request.called_directly:
        _drain_delivered_queue(self.request, patient=delivery.quick)
    return delivery.outcome


@shared_task(name="runtime.drain_queue", ignore_result=True, acks_late=True)
def drain_queue(queue: str) -> int:
    """A drainer's next turn on a queue it left with work due, or a helper it asked for
    (runtime.executor.queue_drain)."""
    return queue_drain(queue, asked=True)


def _drain_delivered_queue(request: Any, *, patient: bool) -> None:
    """After a delivery, a backlog on its queue is drained (runtime.executor.queue_drain)."""
    queue = (request.delivery_info or {}).get("routing_key") or settings.CELERY_QUEUE
    request_unbind()  # the backlog's calls are other requests' work
    try:
        queue_drain(queue, patient=patient)
    except Exception:
        # The delivery's own work is done; what the batch left is recovered like any claim.
        log.exception("draining %s failed", queue)


@shared_task(name="runtime.wake_wait", ignore_result=True, acks_late=True)
def wake_wait(operation_id: str) -> str:
    return wait_wake(operation_id)


@shared_task(name="runtime.notify_dispatch", ignore_result=True, acks_late=True)
def notify_dispatch() -> dict[str, int]:
    """A trigger's hint: fan out the new notification events and propose the messages due
    (runtime.notifications); the sweeper does the same for a hint that was lost."""
    return _notify_dispatch()


@shared_task(name="runtime.retention", ignore_result=True, acks_late=True)
def retention() -> dict[str, Any]:
    """Beat's periodic retention run (runtime.retention): archive, then remove, in batches. A
    worker runs it, not beat, so a long run never delays a sweep; two runs at once pass over
    each other's locked rows."""
    return retention_run().as_dict()
