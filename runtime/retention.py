"""Retention: ended tasks with every row that hangs off them (operations, the journal,
invocations, artifacts' rows, approvals, signals, ledgers...) are removed ``RETENTION_TASK_DAYS``
after they last moved, and Idempotency-Key records once their replay window
(``IDEMPOTENCY_KEY_HOURS``) passed. What may go is decided by ``runtime.selectors.retention``.

Each batch is first written to the artifact storage as JSON lines (``retention/<day>/...``: one
line per task tree with its rows by table, or one line per Idempotency-Key record), and only
then removed, in a short transaction of its own. Under that transaction the batch's operation
rows and then its task rows (the global lock order) are locked ``SKIP LOCKED`` on PostgreSQL, so
retention never waits for live work, and every task is checked again under its lock: a tree one
of whose tasks is held by another transaction, or moved since it was archived, is left for a
later run (its line is in the archive all the same: the audit record lists it as skipped).
The removal of each batch is recorded as an ``AuditRecord`` by ``system:retention``, with its
counts and its archive's name, in the transaction that removes it.

Rate-limit counters (``RateCounter``, the embedded mode's and a Redis outage's) go once their
window ended and a whole ``RATE_WINDOW_SECONDS`` more passed (a back-off row is forgotten that
long after its last wait), unarchived: a counter of failed attempts that no longer counts holds
nothing anyone must keep, and a missing row decides exactly as a dead one would. Each is
deleted by a statement that re-checks its age, so a counter a concurrent attempt just moved
stays.

Stored bytes are not deleted here: an artifact's row goes, and its content, once nothing
references it, is reclaimed by the reconciler (``runtime.artifact_reconciliation``)."""

from __future__ import annotations

import json
import logging
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.files import File
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Max, Min
from django.utils import timezone

from runtime import dialect
from runtime.actors import RETENTION
from runtime.artifact_store import artifact_storage
from runtime.crashpoints import crash_point
from runtime.db import outside_transaction
from runtime.models import AuditRecord, IdempotentRequest, Operation, RateCounter, Task
from runtime.selectors.retention import (
    PARTS,
    Unit,
    expired_requests,
    retention_units,
    unit_rows,
    units_unchanged,
)

log = logging.getLogger(__name__)

ACTOR = RETENTION
ARCHIVE_PREFIX = "retention/"
ARCHIVE_READ = 20  # trees read for the archive at a time
ARCHIVE_SPOOL = 16 * 1024 * 1024  # bytes of an archive kept in memory before it spills to disk
COUNTER_BATCH = 1000  # dead rate-limit counters deleted by one statement


@dataclass
class Removed:
    """What one class lost (or, in a dry run, would lose): how many, the oldest and newest
    moment among them, and for tasks the rows of each table that went with them."""

    count: int = 0
    oldest: datetime | None = None
    newest: datetime | None = None
    rows: dict[str, int] = field(default_factory=dict)

    def saw(self, count: int, oldest: datetime | None, newest: datetime | None) -> None:
        self.count += count
        if oldest is not None and (self.oldest is None or oldest < self.oldest):
            self.oldest = oldest
        if newest is not None and (self.newest is None or newest > self.newest):
            self.newest = newest

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "oldest": self.oldest.isoformat() if self.oldest else None,
            "newest": self.newest.isoformat() if self.newest else None,
            **({"rows": dict(sorted(self.rows.items()))} if self.rows else {}),
        }


@dataclass
class RetentionReport:
    dry_run: bool
    tasks: Removed = field(default_factory=Removed)
    idempotency_keys: Removed = field(default_factory=Removed)
    rate_counters: Removed = field(default_factory=Removed)
    skipped: int = 0  # trees left under their lock (live again, or held by other work)
    archives: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "tasks": self.tasks.as_dict(),
            "idempotency_keys": self.idempotency_keys.as_dict(),
            "rate_counters": self.rate_counters.as_dict(),
            "skipped": self.skipped,
            "archives": self.archives,
        }


def retention_run(now: datetime | None = None, *, dry_run: bool = False) -> RetentionReport:
    """Archive and remove what the retention settings let go (at most ``RETENTION_BATCHES``
    batches of each class), or with ``dry_run`` only count everything that may go now.

    Preconditions: outside any transaction (each batch's archive is written to the storage, a
    remote call, before the batch's own transaction opens)."""
    now = now or timezone.now()
    report = RetentionReport(dry_run=dry_run)
    if settings.RETENTION_TASK_DAYS > 0:
        cutoff = now - timedelta(days=float(settings.RETENTION_TASK_DAYS))
        _tasks_remove(cutoff, now, report)
    if settings.IDEMPOTENCY_KEY_HOURS > 0:
        cutoff = now - timedelta(hours=float(settings.IDEMPOTENCY_KEY_HOURS))
        _requests_remove(cutoff, now, report)
    _counters_remove(now - timedelta(seconds=int(settings.RATE_WINDOW_SECONDS)), report)
    if not dry_run and (report.tasks.count or report.idempotency_keys.count):
        log.info("retention: %s", report.as_dict())
    return report


def retention_due(now: datetime, last: datetime | None) -> bool:
    """Whether beat should start a run (every ``RETENTION_SECONDS``; 0: never). A run is due
    even with both retention classes off: dead rate-limit counters still go."""
    every = float(settings.RETENTION_SECONDS)
    if every <= 0:
        return False
    return last is None or (now - last).total_seconds() >= every


def _tasks_remove(cutoff: datetime, now: datetime, report: RetentionReport) -> None:
    after: tuple[datetime, str] | None = None
    batches = 0
    while report.dry_run or batches < settings.RETENTION_BATCHES:
        units, after = retention_units(cutoff, limit=settings.RETENTION_BATCH, after=after)
        if after is None:
            return
        if not units:
            continue
        batches += 1
        if report.dry_run:
            _units_count(units, report.tasks)
        else:
            _batch_remove(units, cutoff, now, report)


def _units_count(units: list[Unit], removed: Removed) -> None:
    task_ids = [task_id for unit in units for task_id in unit.seen]
    removed.saw(len(task_ids), min(u.at for u in units), max(u.at for u in units))
    for part in PARTS:
        n = part.rows(task_ids).count()
        if n:
            removed.rows[part.table] = removed.rows.get(part.table, 0) + n


def _batch_remove(
    units: list[Unit], cutoff: datetime, now: datetime, report: RetentionReport
) -> None:
    name = _archive_write(now, "tasks", _tree_lines(units))
    report.archives.append(name)
    crash_point("retention.archived")
    with transaction.atomic():
        kept = units_unchanged(_locked(units), cutoff)
        counts = _units_delete(kept)
        skipped = sorted({u.root for u in units} - {u.root for u in kept})
        AuditRecord.objects.create(
            at=now,
            actor=ACTOR,
            action="retention.tasks_removed",
            subject=name,
            detail={
                "tasks": sum(len(u.seen) for u in kept),
                "trees": len(kept),
                "rows": counts,
                "skipped": skipped,
                "before": str(cutoff),
            },
        )
    report.skipped += len(skipped)
    if kept:
        tasks = sum(len(u.seen) for u in kept)
        report.tasks.saw(tasks, min(u.at for u in kept), max(u.at for u in kept))
        for table, n in counts.items():
            report.tasks.rows[table] = report.tasks.rows.get(table, 0) + n


def _locked(units: list[Unit]) -> list[Unit]:
    """The units all of whose operation rows and task rows this transaction now holds, taken in
    the global order (operations by id, then tasks by id) and passing over rows another
    transaction holds. SQLite has no row locks: its write transaction is the only one."""
    if not dialect.skip_locked_rows():
        crash_point("retention.locked")
        return units
    ids = [task_id for unit in units for task_id in unit.seen]
    ops = dict(Operation.objects.filter(task_id__in=ids).values_list("id", "task_id"))
    held = set(
        Operation.objects.select_for_update(skip_locked=True)
        .filter(task_id__in=ids)
        .order_by("id")
        .values_list("id", flat=True)
    )
    busy = {task_id for op_id, task_id in ops.items() if op_id not in held}
    tasks = set(
        Task.objects.select_for_update(skip_locked=True)
        .filter(id__in=ids)
        .order_by("id")
        .values_list("id", flat=True)
    )
    crash_point("retention.locked")
    return [u for u in units if all(t in tasks and t not in busy for t in u.seen)]


def _units_delete(units: list[Unit]) -> dict[str, int]:
    """Delete every row of the units, table by table (PARTS' order). The rows are deleted as
    they are, without Django's collector: the plan already names every table that points at a
    task, and the foreign keys are checked at commit (deferred on both databases)."""
    ids = [task_id for unit in units for task_id in unit.seen]
    counts: dict[str, int] = {}
    if not ids:
        return counts
    for part in PARTS:
        # _raw_delete: one DELETE per table, no cascade collection (Task has PROTECT relations
        # that are all inside the unit, which the collector would refuse).
        n = part.rows(ids)._raw_delete(part.rows(ids).db)
        if n:
            counts[part.table] = n
    return counts


def _requests_remove(cutoff: datetime, now: datetime, report: RetentionReport) -> None:
    expired = IdempotentRequest.objects.filter(created_at__lt=cutoff)
    if report.dry_run:
        found = expired.aggregate(oldest=Min("created_at"), newest=Max("created_at"))
        report.idempotency_keys.saw(expired.count(), found["oldest"], found["newest"])
        return
    table = IdempotentRequest._meta.db_table
    for _ in range(settings.RETENTION_BATCHES):
        rows = expired_requests(cutoff, settings.RETENTION_BATCH)
        if not rows:
            return
        name = _archive_write(now, "idempotency-keys", ({"table": table, "row": r} for r in rows))
        report.archives.append(name)
        with transaction.atomic():
            # created_at again: a record taken over meanwhile (an abandoned first request run
            # again, runtime.idempotent_requests) has a new one and stays.
            n, _ = expired.filter(id__in=[r["id"] for r in rows]).delete()
            AuditRecord.objects.create(
                at=now,
                actor=ACTOR,
                action="retention.idempotency_keys_removed",
                subject=name,
                detail={"records": n, "before": str(cutoff)},
            )
        report.idempotency_keys.saw(n, rows[0]["created_at"], rows[-1]["created_at"])


def _counters_remove(cutoff: datetime, report: RetentionReport) -> None:
    dead = RateCounter.objects.filter(window_ends_at__lt=cutoff)
    if report.dry_run:
        found = dead.aggregate(oldest=Min("window_ends_at"), newest=Max("window_ends_at"))
        report.rate_counters.saw(dead.count(), found["oldest"], found["newest"])
        return
    for _ in range(settings.RETENTION_BATCHES):
        keys = list(dead.order_by("window_ends_at").values_list("key", flat=True)[:COUNTER_BATCH])
        if not keys:
            return
        # The age again, in the DELETE itself: a counter moved since it was read stays.
        n, _ = dead.filter(key__in=keys).delete()
        report.rate_counters.saw(n, None, None)


def _tree_lines(units: list[Unit]) -> Iterator[dict[str, Any]]:
    """One archive line per tree, read ARCHIVE_READ trees at a time: a batch of long journals
    is never held in memory at once."""
    for start in range(0, len(units), ARCHIVE_READ):
        chunk = units[start : start + ARCHIVE_READ]
        rows = unit_rows(chunk)
        yield from ({"task": unit.root, "tables": rows[unit.root]} for unit in chunk)


def _archive_write(now: datetime, kind: str, lines: Iterable[dict[str, Any]]) -> str:
    """Write the lines (JSON, one object each) to the artifact storage under a dated name that
    no other run can take; returns the name stored. The file is spooled (to disk past
    ARCHIVE_SPOOL bytes) and then handed to the storage as one object."""
    outside_transaction("writing a retention archive")
    name = f"{ARCHIVE_PREFIX}{now:%Y-%m-%d}/{kind}-{now:%H%M%S}-{uuid.uuid4().hex[:12]}.jsonl"
    with tempfile.SpooledTemporaryFile(max_size=ARCHIVE_SPOOL) as spool:
        for line in lines:
            spool.write(json.dumps(line, cls=DjangoJSONEncoder, sort_keys=True).encode() + b"\n")
        spool.seek(0)
        return str(artifact_storage().save(name, File(spool, name=name)))
