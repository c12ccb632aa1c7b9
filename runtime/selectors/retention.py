"""What retention may remove (reads only; runtime.retention removes it).

A task goes with everything that hangs off it, and never alone: the unit is a root task (one
with no parent) with all its descendants, since a child's ledger rows live in its parent's
meters. A unit may go only when every task in it is ended (terminal, and not unresolved), quiet
since the cutoff (no journal event since), and holds nothing a machine or a person may still
move: no operation short of settled (so none running, waiting, pending approval, unresolved,
expired or in manual intervention), no live approval, no budget hold still held or unknown, no
upload still staged. The day's notification task is not agent work and is kept (the messages of
other tasks' notifications point at its operations)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Exists, F, Model, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce

from runtime.models import (
    Approval,
    ApprovalVote,
    Artifact,
    ArtifactStatus,
    Attempt,
    BudgetHold,
    BudgetMeter,
    CheckResult,
    Claim,
    Event,
    IdempotentRequest,
    Invocation,
    Notification,
    NotificationEvent,
    NotificationTask,
    Operation,
    OutboxMessage,
    RejectedObservation,
    RequiredCheck,
    Resolution,
    ScheduleRun,
    Signal,
    Task,
    TaskCommand,
    TaskWatch,
    UsageRecord,
)
from runtime.models.operations import IN_FLIGHT
from runtime.rules.statuses import ApprovalStatus, TaskCondition, TaskOutcome


@dataclass(frozen=True)
class Part:
    """One table of a unit: its rows are those whose ``paths`` (each a lookup ending in a task
    id) name a task of the unit; the first path that is set names the row's task."""

    model: type[Model]
    paths: tuple[str, ...]

    @property
    def table(self) -> str:
        return str(self.model._meta.db_table)

    def rows(self, task_ids: Iterable[str]) -> QuerySet[Any]:
        ids = list(task_ids)
        return self.model._default_manager.filter(
            reduce(or_, (Q(**{f"{path}__in": ids}) for path in self.paths))
        )

    def owner(self) -> Any:
        fields = [F(path) for path in self.paths]
        return fields[0] if len(fields) == 1 else Coalesce(*fields)


# Every table with a foreign key to a task or to a row of one (a test checks that no relation
# of Task, Operation, Attempt, Approval, Artifact, BudgetMeter or NotificationEvent is left out),
# in the order they are deleted: rows that point at others before the rows they point at.
PARTS: tuple[Part, ...] = (
    Part(
        Notification,
        ("event__task_id", "event__operation__task_id", "event__approval__task_id"),
    ),
    Part(NotificationEvent, ("task_id", "operation__task_id", "approval__task_id")),
    Part(Event, ("task_id", "operation__task_id")),
    Part(ApprovalVote, ("approval__task_id",)),
    Part(Approval, ("task_id", "operation__task_id")),
    Part(Signal, ("task_id",)),
    Part(TaskCommand, ("task_id",)),
    Part(TaskWatch, ("task_id",)),
    Part(CheckResult, ("task_id",)),
    Part(RequiredCheck, ("task_id",)),
    Part(UsageRecord, ("meter__task_id", "operation__task_id", "child_task_id")),
    Part(BudgetHold, ("meter__task_id", "operation__task_id", "child_task_id")),
    Part(BudgetMeter, ("task_id",)),
    Part(Invocation, ("operation__task_id",)),
    Part(Resolution, ("operation__task_id",)),
    Part(Claim, ("operation__task_id",)),
    Part(RejectedObservation, ("operation__task_id",)),
    Part(OutboxMessage, ("operation__task_id",)),
    Part(Artifact, ("task_id",)),
    Part(ScheduleRun, ("task_id",)),
    Part(Operation, ("task_id",)),
    Part(Attempt, ("task_id",)),
    Part(Task, ("id",)),
)

_ENDED = (TaskOutcome.SUCCEEDED, TaskOutcome.FAILED, TaskOutcome.CANCELLED)
_LIVE_APPROVAL = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED, ApprovalStatus.EXPIRED)


def removable(cutoff: datetime) -> Q:
    """The rule for one task (see the module's docstring), as a filter on Task."""
    task = OuterRef("pk")
    # IN_FLIGHT (every status short of settled) is op_live's predicate: the index of the few
    # operations in flight answers this, however many settled ones there are.
    unsettled = Operation.objects.filter(task=task, status__in=IN_FLIGHT)
    # Quiet since the cutoff: every journal event moves its task's updated_at (events.task_touch
    # writes both with one ``now``), so the journal itself need not be read.
    return Q(
        ~Exists(unsettled),
        ~Exists(Approval.objects.filter(task=task, status__in=_LIVE_APPROVAL)),
        ~Exists(BudgetHold.objects.filter(meter__task=task).exclude(status=BudgetHold.SETTLED)),
        ~Exists(Artifact.objects.filter(task=task, status=ArtifactStatus.STAGED)),
        ~Exists(NotificationTask.objects.filter(task=task)),
        condition=TaskCondition.TERMINAL,
        outcome__in=_ENDED,
        updated_at__lt=cutoff,
    )


@dataclass(frozen=True)
class Unit:
    """A root task and its descendants, each with the (event_seq, state_version) it was read
    at: the removal goes ahead only for a unit none of whose tasks moved since."""

    root: str
    at: datetime  # when the root last moved (its updated_at)
    seen: dict[str, tuple[int, int]]

    @property
    def task_ids(self) -> list[str]:
        return list(self.seen)


def retention_units(
    cutoff: datetime, *, limit: int, after: tuple[datetime, str] | None
) -> tuple[list[Unit], tuple[datetime, str] | None]:
    """Up to ``limit`` removable units, oldest created first after the keyset ``after`` (on
    ``task_recent``'s columns, so PostgreSQL walks that index from its old end instead of
    sorting every ended task), and the keyset to continue from (None when nothing is left to
    look at). A root whose tree holds a task that may not go is passed over (its descendants
    are never removed alone)."""
    roots = Task.objects.filter(removable(cutoff), parent__isnull=True)
    if after is not None:
        roots = roots.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
    found = list(
        roots.order_by("created_at", "id").values_list(
            "id", "created_at", "updated_at", "event_seq", "state_version"
        )[:limit]
    )
    if not found:
        return [], None
    units = {row[0]: Unit(row[0], row[2], {row[0]: (row[3], row[4])}) for row in found}
    blocked = _descendants_add(units, cutoff)
    return [u for root, u in units.items() if root not in blocked], (found[-1][1], found[-1][0])


def _descendants_add(units: dict[str, Unit], cutoff: datetime) -> set[str]:
    """Add every descendant to its root's unit, level by level for all roots at once; returns
    the roots whose tree holds a task that may not go."""
    root_of = {root: root for root in units}
    frontier = list(units)
    while frontier:
        children = list(
            Task.objects.filter(parent_id__in=frontier).values_list(
                "id", "parent_id", "event_seq", "state_version"
            )
        )
        for task_id, parent_id, seq, version in children:
            root_of[task_id] = root_of[parent_id]
            units[root_of[task_id]].seen[task_id] = (seq, version)
        frontier = [row[0] for row in children]
    descendants = [task_id for task_id, root in root_of.items() if task_id != root]
    may_go = set(
        Task.objects.filter(removable(cutoff), id__in=descendants).values_list("id", flat=True)
    )
    return {root_of[task_id] for task_id in descendants if task_id not in may_go}


def units_unchanged(units: list[Unit], cutoff: datetime) -> list[Unit]:
    """The units whose every task still may go and has not moved since it was read (called
    under the tasks' locks: what is read then cannot move until the removal commits)."""
    ids = [task_id for unit in units for task_id in unit.seen]
    now_seen = {
        row[0]: (row[1], row[2])
        for row in Task.objects.filter(removable(cutoff), id__in=ids).values_list(
            "id", "event_seq", "state_version"
        )
    }
    return [
        unit
        for unit in units
        if all(now_seen.get(task_id) == seen for task_id, seen in unit.seen.items())
    ]


def unit_rows(units: list[Unit]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every row of the units, by root and by table: what the archive keeps."""
    root_of = {task_id: unit.root for unit in units for task_id in unit.seen}
    out: dict[str, dict[str, list[dict[str, Any]]]] = {unit.root: {} for unit in units}
    for part in PARTS:
        rows = part.rows(root_of).annotate(retention_task=part.owner()).values()
        for row in rows:
            root = root_of.get(row.pop("retention_task"))
            if root is not None:
                out[root].setdefault(part.table, []).append(row)
    return out


def expired_requests(cutoff: datetime, limit: int) -> list[dict[str, Any]]:
    """Idempotency-Key records older than the replay window, oldest first."""
    found = IdempotentRequest.objects.filter(created_at__lt=cutoff).order_by("created_at", "id")
    return [dict(row) for row in found[:limit].values()]
