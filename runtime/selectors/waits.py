"""Reads of durable waits (selectors): the expired waits an admin can act on (with their expired
approvals, and how many), and a task's waits for its page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from runtime.actors import Actor
from runtime.models import Approval, Operation
from runtime.policy import task_scope
from runtime.rules.statuses import ApprovalStatus, OperationStatus

S = OperationStatus


def expired_waits(actor: Actor, limit: int = 200) -> list[Operation]:
    """Expired waits an admin can act on: expired signal waits and expired approval requests."""
    qs = Operation.objects.filter(task_scope(actor, "task__"), status=S.EXPIRED).filter(
        Q(kind=Operation.KIND_WAIT_SIGNAL) | Q(approvals__status=ApprovalStatus.EXPIRED)
    )
    return list(qs.select_related("task").distinct().order_by("updated_at", "id")[:limit])


@dataclass(frozen=True)
class ExpiredWait:
    operation: Operation
    approval: Approval | None  # the expired approval request; None for a signal wait


def expired_waits_with_approvals(actor: Actor, limit: int = 200) -> list[ExpiredWait]:
    """``expired_waits`` with each one's expired approval, read in one query for the page."""
    ops = expired_waits(actor, limit=limit)
    approvals = {
        a.operation_id: a
        for a in Approval.objects.filter(
            operation_id__in=[op.pk for op in ops if op.approval_required],
            status=ApprovalStatus.EXPIRED,
        )
    }
    return [ExpiredWait(op, approvals.get(op.pk)) for op in ops]


def expired_wait_count() -> int:
    return (
        Operation.objects.filter(status=S.EXPIRED)
        .filter(Q(kind=Operation.KIND_WAIT_SIGNAL) | Q(approvals__status=ApprovalStatus.EXPIRED))
        .distinct()
        .count()
    )


def waits_of_task(task_id: str) -> list[dict[str, Any]]:
    """The task's waits (approval, signal, timer) for its page, oldest first."""
    ops = Operation.objects.filter(task_id=task_id).filter(
        Q(kind__in=(Operation.KIND_WAIT_SIGNAL, Operation.KIND_TIMER)) | Q(approval_required=True)
    )
    return [
        {
            "op": op,
            "kind": "approval" if op.approval_required else op.kind,
            "until": op.wait_until,
        }
        for op in ops.order_by("created_at", "id")
    ]
