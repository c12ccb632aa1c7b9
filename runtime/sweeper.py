"""The sweeper (Celery beat, every SWEEP_SECONDS): expired leases, stale outbox rows. The database
says what is due; the broker is never the record."""

from __future__ import annotations

from django.utils import timezone

from runtime.leases import lease_expire_sweep
from runtime.outbox import outbox_sweep


def sweep_once() -> dict[str, int]:
    now = timezone.now()
    return {
        "leases_expired": lease_expire_sweep(now),
        "outbox_republished": outbox_sweep(now),
    }
