"""The sweeper (its own process, `manage.py beat`, every SWEEP_SECONDS): expired leases, stale
outbox rows, expired approvals, due timers and expired signal waits, schedules' due slots
(runtime.schedules), and in embedded mode the broker's spent messages. The database says what
is due; the broker is never the record."""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from runtime.approval_expiry import approval_expire_sweep
from runtime.artifact_reconciliation import artifact_reconcile, reconcile_due
from runtime.cancellation import children_sweep
from runtime.notifications.dispatch import notify_dispatch
from runtime.notifications.reminders import expiry_notice_sweep
from runtime.outbox import outbox_sweep
from runtime.publish import RETENTION, publish
from runtime.retention import retention_due
from runtime.schedules.firing import schedules_sweep
from runtime.sqlfiles import queries
from runtime.transitions.lease import lease_expire_sweep
from runtime.waits import wait_sweep

log = logging.getLogger(__name__)

_SQL = queries("embedded_broker_purge", slots={})


_last_reconcile: list[datetime] = []
_last_retention: list[datetime] = []


def sweep_once() -> dict[str, int]:
    now = timezone.now()
    counts = {
        "leases_expired": lease_expire_sweep(),  # on the database's clock, not this host's
        "outbox_republished": outbox_sweep(now),
        "children": children_sweep(now),
        "approvals_expired": approval_expire_sweep(now),
        **wait_sweep(now),
        **{f"schedules_{k}": v for k, v in schedules_sweep(now).items()},
        "broker_purged": embedded_broker_purge(),
        "notifications_expiring": expiry_notice_sweep(now),
    }
    try:
        # Events whose hint was lost, and notifications held by quiet hours or a digest.
        counts.update(notify_dispatch(now))
    except Exception:
        log.warning("notification dispatch failed; retried next sweep", exc_info=True)
    if reconcile_due(now, _last_reconcile[-1] if _last_reconcile else None):
        # Listing storage is not free: artifacts are reconciled every ARTIFACT_RECONCILE_SECONDS.
        _last_reconcile[:] = [now]
        try:
            counts.update({f"artifacts_{k}": v for k, v in artifact_reconcile(now).items()})
        except Exception:
            log.warning("artifact reconciliation failed; retried next time", exc_info=True)
    counts["retention_started"] = retention_start(now)
    return counts


def retention_start(now: datetime) -> int:
    """Every RETENTION_SECONDS, a retention run is handed to a worker (runtime.retention): its
    batches may take a while, and the sweeps must not wait for them. A publish that fails is
    tried again at the next sweep."""
    if not retention_due(now, _last_retention[-1] if _last_retention else None):
        return 0
    try:
        publish(RETENTION)
    except Exception:
        log.warning("could not start retention; tried again next sweep", exc_info=True)
        return 0
    _last_retention[:] = [now]
    return 1


def embedded_broker_purge() -> int:
    """kombu's SQLAlchemy transport never deletes delivered messages (it only hides them), so the
    embedded broker's file would grow forever (PITFALLS.md)."""
    url = str(settings.CELERY_BROKER_URL)
    if not settings.EMBEDDED_BROKER or not url.startswith("sqla+"):
        return 0
    try:
        from sqlalchemy import create_engine, text  # noqa: PLC0415 (the embedded broker only)

        engine = create_engine(url[len("sqla+") :])
        with engine.begin() as conn:
            result = conn.execute(text(_SQL["embedded_broker_purge"]))
        engine.dispose()
        return int(result.rowcount or 0)
    except Exception:
        log.debug("embedded broker purge skipped", exc_info=True)
        return 0
