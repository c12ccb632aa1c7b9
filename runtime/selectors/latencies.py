"""The latency histograms of ``/metrics``, read from the journal at scrape time as the other
figures are (runtime.selectors.metrics): every transition that ends an interval is a journal
event, and so is the one that started it, written by whichever process moved the work (a
worker, the web, the sweeper, on any machine). Nothing is timed on the hot path, and every
process serving ``/metrics`` reports the same histogram, so several web processes need no
shared state and workers no endpoint:

- schedule to start: from an operation's becoming due (its last event before the claim: its
  proposal, its approval, a takeover; a scheduled retry's ``retry_at``) to its claim;
- run time, by tool: from a claim to the acceptance of its report (succeeded, failed, a retry
  scheduled, an outcome unknown);
- time to a person's decision, by decision: from an approval's request to its approval or
  denial.

Counted like ``JournalTally``: incrementally over the journal's primary key, each process
observing every ending event once (its first scrape reads those the journal holds, which
retention bounds), an event appended less than SETTLE_SECONDS ago observed afresh at each
scrape until it settles. Each ending event costs one index probe for its start (the task's
events, newest first, by ``(task, seq)``)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import CharField, Max, OuterRef, Q, Subquery, Value
from django.db.models.fields.json import KT
from django.utils.dateparse import parse_datetime

from runtime.models import Event
from runtime.rules.statuses import OperationStatus
from runtime.selectors.metrics import SETTLE_SECONDS

S = OperationStatus

# Upper bounds (seconds): machine latencies (a claim within milliseconds, a call within
# minutes) and a person's (minutes to days).
MACHINE_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MACHINE_BUCKETS += (10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
PERSON_BUCKETS: tuple[float, ...] = (10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
PERSON_BUCKETS += (4 * 3600.0, 12 * 3600.0, 24 * 3600.0, 72 * 3600.0, 7 * 24 * 3600.0)

ACCEPTED = tuple(f"operation.{edge}" for edge in ("succeeded", "failed", "retry_scheduled"))
ACCEPTED += ("operation.outcome_unknown",)
DECIDED = ("approval.approved", "approval.denied")


@dataclass
class Buckets:
    """One histogram series: counts per upper bound (not cumulative; the last is +Inf), and
    the sum of what was observed."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        index = next((i for i, b in enumerate(self.bounds) if seconds <= b), len(self.bounds))
        self.counts[index] += 1
        self.total += seconds

    def plus(self, other: Buckets) -> Buckets:
        counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        return Buckets(self.bounds, counts, self.total + other.total)

    def cumulative(self) -> list[int]:
        running, out = 0, []
        for n in self.counts:
            running += n
            out.append(running)
        return out


@dataclass
class JournalLatency:
    """A histogram of the time from an operation's event matching ``start`` to the next event
    of it matching ``end`` (the latest ``start`` before each ``end``), by ``label`` (a path
    from the ending event: ``operation__tool``, ``type``), read incrementally as
    ``JournalTally`` counts. ``due``: a timestamp in the starting event's data that, when
    later than the event, is when the interval starts (a retry's due time)."""

    end: Q
    start: Q
    bounds: tuple[float, ...]
    label: str | None = None
    due: str | None = None
    floor: int = 0
    base: dict[str, Buckets] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _rows(self, after: int, upto: int | None) -> Iterable[tuple[datetime, object, str, str]]:
        started = Event.objects.filter(
            self.start,
            task_id=OuterRef("task_id"),
            operation_id=OuterRef("operation_id"),
            seq__lt=OuterRef("seq"),
        ).order_by("-seq")
        rows = Event.objects.filter(self.end, pk__gt=after, operation_id__isnull=False)
        if upto is not None:
            rows = rows.filter(pk__lte=upto)
        rows = rows.annotate(started=Subquery(started.values("at")[:1]))
        due: object = None
        if self.due:
            due = Subquery(started.annotate(d=KT(f"data__{self.due}")).values("d")[:1])
        rows = rows.annotate(due_at=due if due is not None else Value(None, CharField()))
        return rows.values_list("at", "started", "due_at", self.label or "type").iterator(2000)

    def _observe(self, into: dict[str, Buckets], after: int, upto: int | None) -> None:
        for at, started, due_at, label in self._rows(after, upto):
            if started is None:
                continue  # its start is gone (retention) or never journalled
            begin: datetime = started  # type: ignore[assignment]
            due = parse_datetime(str(due_at)) if due_at else None
            if due is not None and due > begin:
                begin = due
            key = _label(self.label, str(label or ""))
            into.setdefault(key, Buckets(self.bounds)).observe(
                max(0.0, (at - begin).total_seconds())
            )

    def totals(self, now: datetime) -> dict[str, Buckets]:
        """Every ending event's interval, by label, as of now."""
        with self.lock:
            cutoff = now - timedelta(seconds=SETTLE_SECONDS)
            settled = Event.objects.filter(self.end, pk__gt=self.floor, at__lt=cutoff)
            floor = settled.aggregate(m=Max("pk"))["m"]
            if floor is not None:
                self._observe(self.base, self.floor, int(floor))
                self.floor = int(floor)
            fresh: dict[str, Buckets] = {}
            self._observe(fresh, self.floor, None)
            keys = set(self.base) | set(fresh)
            empty = Buckets(self.bounds)
            return {k: self.base.get(k, empty).plus(fresh.get(k, empty)) for k in sorted(keys)}


def _label(path: str | None, value: str) -> str:
    if path == "type":
        return value.partition(".")[2]  # approval.approved: "approved"
    return value


def schedule_to_start() -> JournalLatency:
    """From an operation's becoming due to its claim."""
    return JournalLatency(
        end=Q(type="operation.claimed"),
        start=Q(type__startswith="operation.") | Q(type__startswith="approval."),
        bounds=MACHINE_BUCKETS,
        due="retry_at",
    )


def run_time() -> JournalLatency:
    """From a claim to its report's acceptance, by tool."""
    return JournalLatency(
        end=Q(type__in=ACCEPTED, data__from=S.RUNNING),
        start=Q(type="operation.claimed"),
        bounds=MACHINE_BUCKETS,
        label="operation__tool",
    )


def decision_time() -> JournalLatency:
    """From an approval's request to a person's decision, by decision."""
    return JournalLatency(
        end=Q(type__in=DECIDED),
        start=Q(type="approval.requested"),
        bounds=PERSON_BUCKETS,
        label="type",
    )
