"""What ``/metrics`` reads from the database at scrape time. Workers, the sweeper and the web are
separate processes (often on separate machines), and the database is the one record all of them
write, so what happens in workers is counted here, from their rows, when the scraper asks:
nothing on the hot path counts anything.

Every read is bounded: the operations in flight (a status index range), the task counters the
task table's triggers keep, the due outbox, the pending approvals. Events that are only ever
appended (lease takeovers, refused reports, budget refusals at dispatch) are counted
incrementally (``JournalTally``): each scrape reads only the rows appended since the last one,
over the primary key."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Max, Model, Q, Sum

from runtime.models import Approval, Event, Operation, OutboxMessage, RejectedObservation, TaskCount
from runtime.rules.statuses import ApprovalStatus, OperationStatus

S = OperationStatus
# Operations a machine or a person still has to move: counted per status and tool. The settled
# ones (succeeded, failed, cancelled, compensated) only grow, so they are counted per status
# alone, which the status index answers without reading the table's rows.
IN_FLIGHT = tuple(s for s in S.ALL if s not in S.FINAL)

# Upper bounds (seconds) of the pending approvals' age buckets.
APPROVAL_AGE_BUCKETS = (60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)

# A row appended this long ago is taken as final for counting: no transaction of this system
# stays open for a minute (none calls a receiver, the broker or a person inside one), so no row
# with a smaller id can still commit after it.
SETTLE_SECONDS = 60


def operations_in_flight() -> list[tuple[str, str, int]]:
    """(status, tool, count) of the operations not yet settled."""
    rows = (
        Operation.objects.filter(status__in=IN_FLIGHT)
        .values_list("status", "tool")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return [(status, tool, n) for status, tool, n in rows]


def operations_settled() -> dict[str, int]:
    """Settled operations per status (every status present, 0 when none)."""
    rows = dict(
        Operation.objects.filter(status__in=S.FINAL)
        .values_list("status")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("status", "n")
    )
    return {status: int(rows.get(status, 0)) for status in S.FINAL}


def tasks_by_condition() -> list[tuple[str, str, int]]:
    """(condition, outcome, count) of every task, from the counters the triggers keep."""
    rows = TaskCount.objects.values_list("condition", "outcome").annotate(n=Sum("n")).order_by()
    return [(condition, outcome, int(n or 0)) for condition, outcome, n in rows]


def outbox_due(now: datetime) -> dict[str, int]:
    """Announcements due and not yet consumed by a claim, per topic: the queue's depth."""
    rows = (
        OutboxMessage.objects.filter(available_at__lte=now)
        .values_list("topic")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("topic", "n")
    )
    return {topic: int(n) for topic, n in rows}


@dataclass(frozen=True)
class PendingApprovals:
    count: int
    oldest_seconds: float
    total_seconds: float
    # Cumulative counts per upper bound of APPROVAL_AGE_BUCKETS, then +Inf (== count).
    buckets: tuple[int, ...]


def approvals_pending(now: datetime) -> PendingApprovals:
    """How long the requests waiting for a person have waited (one read of the pending ones)."""
    created = list(
        Approval.objects.filter(status=ApprovalStatus.PENDING).values_list("created_at", flat=True)
    )
    ages = [max(0.0, (now - at).total_seconds()) for at in created]
    buckets = tuple(sum(1 for a in ages if a <= bound) for bound in APPROVAL_AGE_BUCKETS)
    return PendingApprovals(
        count=len(ages),
        oldest_seconds=max(ages, default=0.0),
        total_seconds=sum(ages),
        buckets=(*buckets, len(ages)),
    )


@dataclass
class JournalTally:
    """A running count of append-only rows matching ``where``, grouped by ``group``, read
    incrementally over the primary key. ``floor`` is the id up to which rows were counted into
    ``base``: only rows appended at least SETTLE_SECONDS before a scrape move it, so a row that
    commits after a larger id was seen is still counted. Each process keeps its own, and each
    counts every row in the table (the first scrape reads them all once), so processes agree."""

    model: type[Model]
    group: str
    where: Q = field(default_factory=Q)
    at_field: str = "at"
    floor: int = 0
    base: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _counts(self, rows: object) -> Counter[str]:
        grouped = rows.values_list(self.group).annotate(n=Count("pk")).order_by()  # type: ignore[attr-defined]
        return Counter({str(key): int(n) for key, n in grouped})

    def totals(self, now: datetime) -> Counter[str]:
        """Every matching row's count per group, as of now."""
        with self.lock:
            rows = self.model._default_manager.filter(self.where, pk__gt=self.floor)
            cutoff = now - timedelta(seconds=SETTLE_SECONDS)
            floor = rows.filter(**{f"{self.at_field}__lt": cutoff}).aggregate(m=Max("pk"))["m"]
            if floor is not None:
                self.base += self._counts(rows.filter(pk__lte=floor))
                self.floor = int(floor)
                rows = self.model._default_manager.filter(self.where, pk__gt=self.floor)
            return self.base + self._counts(rows)


LEASE_TAKEOVERS = "operation.lease_expired"
REPORT_REJECTED = "operation.report_rejected"
BUDGET_REFUSED_REASON = "budget exhausted"


def journal_tally() -> JournalTally:
    """Lease takeovers and refused (stale) reports, from the journal, by event type."""
    return JournalTally(
        model=Event, group="type", where=Q(type__in=[LEASE_TAKEOVERS, REPORT_REJECTED])
    )


def rejections_tally() -> JournalTally:
    """Rejected observations (stale completions, refused claims of duplicate deliveries...) by
    kind."""
    return JournalTally(model=RejectedObservation, group="kind")


def budget_stops_tally() -> JournalTally:
    """Operations a dispatch found over their budget (the ledger could not hold another call:
    runtime.leases), by the journal event that settled them."""
    return JournalTally(
        model=Event,
        group="type",
        where=Q(type__startswith="operation.", data__reason__startswith=BUDGET_REFUSED_REASON),
    )
