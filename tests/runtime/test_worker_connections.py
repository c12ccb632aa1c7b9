"""A worker process keeps its database connection from one task to the next: Celery's Django
fixup would otherwise close it after every task, and each operation would pay for a new
PostgreSQL connection (a server backend started per operation)."""

from __future__ import annotations

import types

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection

from console.celery import app
from runtime import worker

pytestmark = pytest.mark.django_db(transaction=True)  # no atomic block: close() really closes


def test_the_database_connection_survives_the_fixups_per_task_hooks():
    fixup = DjangoWorkerFixup(app)
    task = types.SimpleNamespace(request=types.SimpleNamespace(is_eager=False))
    connection.ensure_connection()
    opened = connection.connection
    for _ in range(10):  # ten tasks' worth of the hooks Celery calls around each task
        fixup.on_task_prerun(sender=task)
        worker._connections_checked()
        fixup.on_task_postrun(sender=task)
    assert connection.connection is opened


def _counting_health_checks(monkeypatch) -> list[int]:
    checks: list[int] = []
    real = connection.is_usable

    def counted() -> bool:
        checks.append(1)
        return real()

    monkeypatch.setattr(connection, "is_usable", counted)
    return checks


@pytest.mark.postgres  # services mode: health checks are on (CONN_HEALTH_CHECKS)
def test_a_busy_worker_does_not_health_check_its_connection_before_every_task(monkeypatch):
    checks = _counting_health_checks(monkeypatch)
    connection.ensure_connection()
    for _ in range(10):  # back-to-back tasks, each ending just before the next begins
        worker._task_ended()
        worker._connections_checked()
        with connection.cursor() as cur:
            cur.execute("SELECT 2")
    assert checks == []


@pytest.mark.postgres
def test_a_worker_back_from_idleness_checks_its_connection_first(monkeypatch):
    checks = _counting_health_checks(monkeypatch)
    connection.ensure_connection()
    monkeypatch.setattr(worker, "_last_task_end", 0.0)  # its last task ended long ago
    worker._connections_checked()
    with connection.cursor() as cur:
        cur.execute("SELECT 2")
    assert checks == [1]
