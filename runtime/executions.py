"""Executions: physical worker activations. A Celery worker child registers one per process; an
agent's claim makes one per claim. Heartbeats say "recent contact", never "progress"."""

from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta

from django.db import close_old_connections, connection
from django.utils import timezone

from runtime.models import Execution

_current: dict[int, str] = {}
HEARTBEAT_SECONDS = 10


def execution_current(label: str = "") -> str:
    """This process's Execution id, registered on first use (per pid, so a forked child never
    reuses its parent's identity)."""
    pid = os.getpid()
    execution_id = _current.get(pid)
    if execution_id is None:
        execution = Execution.objects.create(
            kind="worker",
            host=socket.gethostname(),
            pid=pid,
            label=label,
            last_heartbeat_at=timezone.now(),
        )
        execution_id = execution.pk
        _current.clear()
        _current[pid] = execution_id
    return execution_id


def execution_for_agent(agent_name: str) -> Execution:
    return Execution.objects.create(
        kind="agent",
        host=f"agent:{agent_name}"[:200],
        label=agent_name[:200],
        last_heartbeat_at=timezone.now(),
    )


def execution_heartbeat(execution_id: str) -> None:
    Execution.objects.filter(pk=execution_id).update(last_heartbeat_at=timezone.now())


def executions_live(within_seconds: int = 3 * HEARTBEAT_SECONDS) -> int:
    since = timezone.now() - timedelta(seconds=within_seconds)
    return Execution.objects.filter(
        kind="worker", last_heartbeat_at__gte=since, stopped_at__isnull=True
    ).count()


def execution_stop(execution_id: str) -> None:
    Execution.objects.filter(pk=execution_id).update(stopped_at=timezone.now())


def execution_current_stop() -> None:
    """This process is going away: its registered activation, if any, is marked stopped."""
    for execution_id in list(_current.values()):
        execution_stop(execution_id)


def heartbeat_thread_start(execution_id: str, stop: threading.Event) -> threading.Thread:
    """Keep the process's Execution fresh from a daemon thread with its own connection."""

    def run() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                close_old_connections()
                execution_heartbeat(execution_id)
            except Exception:  # noqa: S112 - contact is best effort; the lease is the authority
                continue
        connection.close()

    thread = threading.Thread(target=run, name="execution-heartbeat", daemon=True)
    thread.start()
    return thread
