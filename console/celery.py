"""The Celery app. Redis (or the embedded SQLite broker) only carries nudges: the database is the
record, the outbox is how work is announced, and the claim's guarded UPDATE is the dedupe."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.conf import settings

app = Celery("console")

if settings.EMBEDDED_BROKER:
    # kombu polls database brokers every polling_interval (1 s by default), which caps throughput;
    # it cannot go in broker_transport_options for the sqla transport (PITFALLS.md).
    from kombu.transport import sqlalchemy as _kombu_sqla

    _kombu_sqla.Transport.polling_interval = 0.1  # type: ignore[attr-defined]

app.conf.update(
    broker_url=settings.CELERY_BROKER_URL,
    broker_connection_retry_on_startup=True,
    broker_connection_timeout=3,
    broker_transport_options={"visibility_timeout": settings.BROKER_VISIBILITY_TIMEOUT}
    if not settings.EMBEDDED_BROKER
    else {},
    # Results live in the runtime's tables; a result backend only slows the path.
    task_ignore_result=True,
    # A killed child must not acknowledge its message (celery #1628): both settings together.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # Publishing fails fast when the broker is down: the outbox row stays and the sweeper
    # republishes it, so a request never hangs on Redis.
    task_publish_retry=True,
    task_publish_retry_policy={
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
    },
    task_default_queue=settings.CELERY_QUEUE,
    task_queues=[Queue(q) for q in settings.CELERY_QUEUES],
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    # console.worker_logs: the worker's own output as the settings' logging has it.
    include=["runtime.worker", "console.worker_logs"],
    # Celery's Django fixup closes every database connection after every task unless this is
    # set, so each operation paid for a new PostgreSQL connection (a backend fork). Connections
    # are kept (closed after this many tasks x 2 by the fixup, and earlier by Django's own
    # CONN_MAX_AGE and health checks, run before each task in runtime/worker.py).
    CELERY_DB_REUSE_MAX=1000,
    timezone="UTC",
)
