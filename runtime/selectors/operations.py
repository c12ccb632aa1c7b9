"""Reads of operations (selectors): one operation for an actor (``operation_get``; for the agent
that runs it, ``operation_get_for_agent``), a page of them, their invocations; and one
operation's whole story, for its console page: the journal's entries
about it, its invocations grouped by lease generation, approvals, resolutions, budget holds and
refused observations. A fixed number of statements, however long the story."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from runtime.actors import Actor
from runtime.errors import InvalidInput, NotFound, StaleLease
from runtime.history import NO_FILTER, HistoryColumns, HistoryFilter, history_page
from runtime.models import (
    Approval,
    BudgetHold,
    Event,
    Invocation,
    Operation,
    RejectedObservation,
    Resolution,
)
from runtime.policy import can_claim, task_scope
from runtime.rules.statuses import OperationStatus

S = OperationStatus


def operation_get(actor: Actor, operation_id: str) -> Operation:
    """The operation if the actor may see its task; NotFound otherwise."""
    op = Operation.objects.filter(task_scope(actor, "task__"), pk=operation_id).first()
    if op is None:
        raise NotFound("no such operation")
    return op


def operation_get_for_agent(actor: Actor, operation_id: str, *, leased: bool = False) -> Operation:
    """The operation, for the agent that runs it over the API (claim, heartbeat, complete).

    NotFound when the actor may not see it; NotAuthorized unless the actor is the task's agent
    (``policy.can_claim``). With ``leased``: StaleLease for a worker-run operation, whose lease
    is only ever held by a worker, so no API call can heartbeat or complete it."""
    op = operation_get(actor, operation_id)
    can_claim(actor, op)
    if leased and op.executor != Operation.EXECUTOR_AGENT:
        raise StaleLease("this operation is run by the workers; no API claim holds its lease")
    return op


def operation_list(
    actor: Actor,
    *,
    task_id: str | None = None,
    status: str | None = None,
    after: tuple[datetime, str] | None = None,
    limit: int = 50,
) -> list[Operation]:
    if status and status not in S.ALL:
        raise InvalidInput(f"status must be one of {', '.join(S.ALL)}")
    qs: QuerySet[Operation] = Operation.objects.filter(task_scope(actor, "task__"))
    if task_id:
        qs = qs.filter(task_id=task_id)
    if status:
        qs = qs.filter(status=status)
    if after is not None:
        at, last_id = after
        qs = qs.filter(created_at__gt=at) | qs.filter(created_at=at, id__gt=last_id)
    return list(qs.order_by("created_at", "id")[:limit])


def invocations_of(operation: Operation) -> list[Invocation]:
    return invocations_by_operation([operation.pk])[operation.pk]


def invocations_by_operation(operation_ids: list[str]) -> dict[str, list[Invocation]]:
    """The invocations of a whole page of operations in one query (never one per row)."""
    found: dict[str, list[Invocation]] = {op_id: [] for op_id in operation_ids}
    for inv in Invocation.objects.filter(operation_id__in=operation_ids).order_by(
        "operation_id", "number"
    ):
        found[inv.operation_id].append(inv)
    return found


# Each part of the story is cut at this many rows (the oldest kept): an operation retried or
# re-leased thousands of times still renders one page.
STORY_ROWS = 500


@dataclass
class LeaseGeneration:
    """One lease generation: who held it, the invocations made under it, and what a holder
    tried after it was no longer current (refused observations)."""

    generation: int
    executions: list[str] = field(default_factory=list)
    invocations: list[Invocation] = field(default_factory=list)
    rejections: list[RejectedObservation] = field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass
class OperationStory:
    op: Operation
    events: list[Event]
    invocations: list[Invocation]
    leases: list[LeaseGeneration]
    approvals: list[Approval]
    resolutions: list[Resolution]
    holds: list[BudgetHold]
    rejections: list[RejectedObservation]
    compensations: list[Operation]


def operation_story(actor: Actor, operation_id: str) -> OperationStory:
    """The operation and its story, if the actor may see its task; NotFound otherwise.
    Preconditions: none."""
    op = (
        Operation.objects.filter(task_scope(actor, "task__"), pk=operation_id)
        .select_related("task", "attempt")
        .first()
    )
    if op is None:
        raise NotFound("no such operation")
    invocations = list(
        Invocation.objects.filter(operation_id=op.pk).order_by("number")[:STORY_ROWS]
    )
    rejections = list(
        RejectedObservation.objects.filter(operation_id=op.pk).order_by("at", "id")[:STORY_ROWS]
    )
    return OperationStory(
        op=op,
        events=list(Event.objects.filter(operation_id=op.pk).order_by("seq")[:STORY_ROWS]),
        invocations=invocations,
        leases=_leases(op, invocations, rejections),
        approvals=list(
            Approval.objects.filter(operation_id=op.pk)
            .prefetch_related("votes")
            .order_by("proposal_version")[:STORY_ROWS]
        ),
        resolutions=list(
            Resolution.objects.filter(operation_id=op.pk).order_by("at", "id")[:STORY_ROWS]
        ),
        holds=list(
            BudgetHold.objects.filter(operation_id=op.pk)
            .select_related("meter")
            .order_by("number", "meter__meter", "id")[:STORY_ROWS]
        ),
        rejections=rejections,
        compensations=list(
            Operation.objects.filter(compensates_id=op.pk).order_by("created_at", "id")[:20]
        ),
    )


def _leases(
    op: Operation, invocations: list[Invocation], rejections: list[RejectedObservation]
) -> list[LeaseGeneration]:
    """Invocations and refused observations by lease generation, oldest first (pure); the
    current generation is listed even before its invocation is recorded."""
    by: dict[int, LeaseGeneration] = {}

    def one(generation: int) -> LeaseGeneration:
        return by.setdefault(generation, LeaseGeneration(generation))

    for inv in invocations:
        lease = one(inv.lease_generation)
        lease.invocations.append(inv)
        if inv.execution_id and inv.execution_id not in lease.executions:
            lease.executions.append(inv.execution_id)
        lease.started_at = min(filter(None, (lease.started_at, inv.started_at)), default=None)
        lease.finished_at = max(filter(None, (lease.finished_at, inv.finished_at)), default=None)
    for rejection in rejections:
        if rejection.lease_generation is not None:
            one(rejection.lease_generation).rejections.append(rejection)
    if op.lease_generation:
        one(op.lease_generation)
    return [by[g] for g in sorted(by)]


def story_transitions(events: list[Event]) -> list[dict[str, Any]]:
    """The status history read from the journal: each entry that moved the operation (its
    ``data.to``), with where it came from when the journal says so (pure)."""
    rows = []
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "operation.proposed" and "to" not in data and data.get("status"):
            data = {**data, "to": data["status"]}
        # Every entry naming this operation that carries "to" moved it (an approval's
        # release is one: "approval.approved" from waiting_approval to pending).
        if "to" in data:
            rows.append(
                {
                    "at": event.at,
                    "type": event.type,
                    "from": data.get("from"),
                    "to": data.get("to"),
                    "actor": event.actor,
                    "reason": data.get("reason") or "",
                    "seq": event.seq,
                }
            )
    return rows


def resolution_history(
    actor: Actor,
    filters: HistoryFilter = NO_FILTER,
    *,
    before: tuple[datetime, int] | None = None,
    limit: int = 50,
) -> list[Resolution]:
    """People's resolutions of unresolved operations the actor may see, the latest first, one
    keyset page (runtime.history); the person is the resolver. Rows come with their operation
    and its task. Preconditions: none (bounds are checked by the caller)."""
    qs = Resolution.objects.filter(task_scope(actor, "operation__task__")).select_related(
        "operation", "operation__task"
    )
    return history_page(qs, _RESOLVED_COLUMNS, filters, before=before, limit=limit)


_RESOLVED_COLUMNS = HistoryColumns(
    at="at", tool="operation__tool", task="operation__task_id", person="actor"
)
