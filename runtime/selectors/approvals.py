"""Reads of approvals (selectors): scoped by the caller's task visibility, keyset-ordered."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.db.models.functions import Coalesce

from runtime.actors import Actor
from runtime.errors import InvalidInput, NotFound
from runtime.history import NO_FILTER, HistoryColumns, HistoryFilter, history_page
from runtime.models import Approval, ApprovalVote, Operation
from runtime.policy import task_scope
from runtime.rules.statuses import ApprovalStatus, OperationStatus


def approval_get(actor: Actor, approval_id: str) -> Approval:
    approval = Approval.objects.filter(task_scope(actor, "task__"), pk=approval_id).first()
    if approval is None:
        raise NotFound("no such approval")
    return approval


# The inbox's orders (the console's ?sort=): each ends on the id, so the order is total.
APPROVAL_SORTS: dict[str, tuple[str, ...]] = {
    "expiry": ("expires_at", "created_at", "id"),  # the request about to expire first
    "oldest": ("created_at", "id"),  # the one waiting longest first
    "newest": ("-created_at", "-id"),
    "tool": ("tool", "expires_at", "id"),
}
# What the history lists: every request a person (or the clock) has settled.
DECIDED = (
    ApprovalStatus.APPROVED,
    ApprovalStatus.RELEASED,
    ApprovalStatus.DENIED,
    ApprovalStatus.EXPIRED,
)


def approval_list(
    actor: Actor,
    *,
    status: str | None = None,
    tool: str | None = None,
    task_id: str | None = None,
    sort: str = "oldest",
    limit: int = 100,
) -> list[Approval]:
    """Approvals the actor may see, in ``sort`` order (APPROVAL_SORTS; oldest request first by
    default). ``pending`` means decidable now: the operation still waits for it (an approval
    whose operation was cancelled is not offered). Each row comes with its task, operation,
    previous proposal and votes (no statement per row)."""
    if status and status not in ApprovalStatus.ALL:
        raise InvalidInput(f"status must be one of {', '.join(ApprovalStatus.ALL)}")
    if sort not in APPROVAL_SORTS:
        raise InvalidInput(f"sort must be one of {', '.join(APPROVAL_SORTS)}")
    qs: QuerySet[Approval] = (
        Approval.objects.filter(task_scope(actor, "task__"))
        .select_related("task", "previous", "operation")
        .prefetch_related("votes")
    )
    if status:
        qs = qs.filter(status=status)
    if status == ApprovalStatus.PENDING:
        qs = qs.filter(operation__status=OperationStatus.WAITING_APPROVAL)
    if tool:
        qs = qs.filter(tool=tool)
    if task_id:
        qs = qs.filter(task_id=task_id)
    return list(qs.order_by(*APPROVAL_SORTS[sort])[:limit])


def approval_history(
    actor: Actor,
    filters: HistoryFilter = NO_FILTER,
    *,
    before: tuple[datetime, str] | None = None,
    limit: int = 50,
) -> list[Approval]:
    """Decided requests (approved, released, denied, expired) the actor may see, the latest
    decision first, one keyset page (runtime.history): each row's ``decided`` is when it was
    settled (its ``decided_at``; an expiry's is its ``expires_at``, when nobody decided); the
    person is the decider. Rows come with their task and operation.
    Preconditions: none (bounds are checked by the caller)."""
    qs = (
        Approval.objects.filter(task_scope(actor, "task__"), status__in=DECIDED)
        .annotate(decided=Coalesce("decided_at", "expires_at"))
        .select_related("task", "operation")
        .prefetch_related("votes")
    )
    return history_page(qs, _DECIDED_COLUMNS, filters, before=before, limit=limit)


_DECIDED_COLUMNS = HistoryColumns(at="decided", tool="tool", task="task_id", person="decided_by")


def approval_current(op: Operation) -> Approval | None:
    """The operation's latest proposal's approval, or None for ungated work."""
    if not op.approval_required:
        return None
    return Approval.objects.filter(operation_id=op.pk).order_by("-proposal_version").first()


def approvals_current(ops: list[Operation]) -> dict[str, Approval]:
    """Each gated operation's latest proposal's approval, in one query (list pages)."""
    latest: dict[str, Approval] = {}
    if not ops:
        return latest
    rows = Approval.objects.filter(operation_id__in=[op.pk for op in ops]).prefetch_related("votes")
    for approval in rows.order_by("operation_id", "proposal_version"):
        latest[approval.operation_id] = approval
    return latest


def approval_voters(approval: Approval) -> list[ApprovalVote]:
    """Its votes so far (the two-person rule), the first first: read from the row's prefetched
    votes when the list prefetched them, else one statement."""
    return sorted(approval.votes.all(), key=lambda v: (v.voted_at, v.pk))


def approved_by(approval: Approval) -> list[str]:
    """Who approved it so far (their labels), the first first."""
    return [v.approver for v in approval_voters(approval)]


def approvals_of_task(task_id: str) -> list[Approval]:
    return list(
        Approval.objects.filter(task_id=task_id).order_by("operation_id", "proposal_version")
    )


def params_diff(approval: Approval) -> list[dict[str, Any]]:
    """What an edit changed against the previous proposal version: one row per top-level key."""
    previous = approval.previous
    if previous is None:
        return []
    before, after = previous.params or {}, approval.params or {}
    rows = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            rows.append(
                {
                    "key": key,
                    "before": before.get(key),
                    "after": after.get(key),
                    "added": key not in before,
                    "removed": key not in after,
                }
            )
    return rows


def pending_approval_tools(limit: int = 50) -> list[str]:
    """The tools of pending requests, for the approvals page's filter."""
    return sorted(
        set(
            Approval.objects.filter(status=ApprovalStatus.PENDING)
            .values_list("tool", flat=True)
            .distinct()[:limit]
        )
    )


def pending_approval_count() -> int:
    return Approval.objects.filter(
        status=ApprovalStatus.PENDING, operation__status=OperationStatus.WAITING_APPROVAL
    ).count()


def first_proposal_hash(op: Operation) -> str | None:
    """The parameter hash the requester proposed, before any edit by a person: an agent that
    repeats its own proposal gets the operation back, not a conflict with the edit."""
    if not op.approval_required:
        return None
    return (
        Approval.objects.filter(operation_id=op.pk, proposal_version=1)
        .values_list("params_hash", flat=True)
        .first()
    )
