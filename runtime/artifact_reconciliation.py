"""Reconciliation of stored bytes with the rows that reference them (the sweeper), under the
retention policy: stopped uploads recovered or failed, never-accepted artifacts of ended tasks
discarded, unreferenced content deleted (each key rechecked under its lock just before)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runtime import artifact_store as store
from runtime.artifacts import (
    artifact_event_txn,
    artifact_fail,
    artifact_mark_stored,
    content_lock_txn,
)
from runtime.crashpoints import crash_point
from runtime.errors import Conflict
from runtime.models import Artifact, ArtifactStatus, ContentKey
from runtime.rules.statuses import TaskCondition

A = ArtifactStatus


def artifact_reconcile(now: datetime | None = None) -> dict[str, int]:
    """Reconcile stored bytes with the rows that reference them, under the retention policy.

    - A ``staged`` row older than ``ARTIFACT_STAGING_GRACE_SECONDS`` is an upload that stopped
      (a crash, a lost connection): when its recorded key verifies it is recovered to
      ``stored``, otherwise it becomes ``failed``.
    - A ``stored`` (never accepted) artifact of a task that has ended, untouched for
      ``ARTIFACT_RETENTION_SECONDS``, is ``discarded``. Tasks still running own their uploads:
      their artifacts are kept whatever their age.
    - Stored content that no holding row references (failed, discarded, or never registered)
      and older than the retention is deleted; each key is rechecked just before deletion.

    Runs its storage calls outside any transaction."""
    now = now or timezone.now()
    retention = now - timedelta(seconds=settings.ARTIFACT_RETENTION_SECONDS)
    counts = {"recovered": 0, "failed": 0, "discarded": 0, "deleted": 0}
    _stopped_uploads_settle(now, counts)
    counts["discarded"] += _unaccepted_discard(now, retention)
    _deletions_finish(now)
    counts["deleted"] += _unreferenced_delete(now, retention)
    return counts


def _stopped_uploads_settle(now: datetime, counts: dict[str, int]) -> None:
    """Staged rows past the grace: recovered when their key verifies, failed otherwise."""
    grace = now - timedelta(seconds=settings.ARTIFACT_STAGING_GRACE_SECONDS)
    for artifact in Artifact.objects.filter(status=A.STAGED, updated_at__lt=grace)[:200]:
        problem = "the upload never recorded its content"
        if artifact.storage_key:
            problem = (
                store.content_verify(
                    artifact.storage_key,
                    store.Measured(store.hex_of(artifact.digest), artifact.size or 0),
                )
                or ""
            )
        if not problem:
            try:
                artifact_mark_stored(
                    artifact.pk, "system:reconciler", reason="recovered by reconciliation"
                )
                counts["recovered"] += 1
            except Conflict:
                pass
        else:
            artifact_fail(artifact, f"upload did not complete: {problem}", "system:reconciler")
            counts["failed"] += 1


def _unaccepted_discard(now: datetime, retention: datetime) -> int:
    """Stored, never accepted artifacts of ended tasks, untouched for the retention: discarded."""
    discarded = 0
    for artifact in Artifact.objects.filter(
        status=A.STORED, updated_at__lt=retention, task__condition=TaskCondition.TERMINAL
    )[:200]:
        with transaction.atomic():
            touched = Artifact.objects.filter(
                pk=artifact.pk, status=A.STORED, updated_at=artifact.updated_at
            ).update(status=A.DISCARDED, status_reason="never accepted", updated_at=now)
            if touched:
                artifact.status = A.DISCARDED
                artifact_event_txn(artifact, "artifact.discarded", now, "system:reconciler")
                discarded += 1
    return discarded


def _deletions_finish(now: datetime) -> None:
    """A deletion that a reconciler began and never finished (it died) is finished here: the
    key stays marked until then, and uploads of those bytes wait for it."""
    stale = now - timedelta(seconds=settings.ARTIFACT_DELETION_STALE_SECONDS)
    for key in ContentKey.objects.filter(deleting_since__lt=stale).values_list("key", flat=True):
        store.content_delete(key)
        ContentKey.objects.filter(key=key).delete()


def _unreferenced_delete(now: datetime, retention: datetime) -> int:
    """Content older than the retention that no holding row references: deleted."""
    deleted = 0
    for key, modified in list(store.content_listing()):
        if modified >= retention:
            continue
        if _content_deletion_begin(key, now):
            crash_point("reconcile.before_delete")
            store.content_delete(key)
            ContentKey.objects.filter(key=key).delete()
            deleted += 1
    return deleted


def _content_deletion_begin(key: str, now: datetime) -> bool:
    """Mark ``key`` as being deleted, under its lock, if no holding row references it (the
    decision and an upload's claim on the key are serialised by that lock)."""
    with transaction.atomic():
        content_lock_txn(key)
        if Artifact.objects.filter(storage_key=key, status__in=A.HOLDING).exists():
            ContentKey.objects.filter(key=key, deleting_since__isnull=True).delete()
            return False
        ContentKey.objects.filter(key=key).update(deleting_since=now)
    return True


def reconcile_due(now: datetime, last: datetime | None) -> bool:
    """Whether the sweeper should reconcile now (storage listings are not free). Pure."""
    return last is None or (now - last).total_seconds() >= settings.ARTIFACT_RECONCILE_SECONDS
